package hostlink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/sshx"
)

// Runner runs programs on the host over the link: an execx.Runner, so a
// package that runs host programs through one (internal/libvirtnet's virsh
// and nft) acts on the remote host unchanged. Each Run is one SSH session
// running the command line sshx.Quote makes of the argv (with env and cd
// before it), its stdin, stdout and stderr carried over the session.
// Detached programs are not started this way (Start refuses): a program
// that must outlive the call runs under a supervisor of agent-vm's there.
type Runner struct {
	C *ssh.Client
}

var _ execx.Runner = Runner{}

// commandLine is c as the remote shell runs it.
func commandLine(c execx.Cmd) string {
	var b strings.Builder
	if c.Dir != "" {
		b.WriteString("cd " + sshx.Quote([]string{c.Dir}) + " && ")
	}
	argv := []string{c.Path}
	if len(c.Env) > 0 {
		argv = append(append([]string{"env"}, c.Env...), c.Path)
	}
	b.WriteString("exec " + sshx.Quote(append(argv, c.Args...)))
	return b.String()
}

// tailKept bounds the stderr an error carries, as execx does.
const tailKept = 4096

// Run implements execx.Runner: a non-zero exit is an *execx.Error with
// the remote stderr's tail.
func (r Runner) Run(ctx context.Context, c execx.Cmd) (execx.Result, error) {
	var stdout, stderr bytes.Buffer
	var out, errOut io.Writer = &stdout, &stderr
	if c.Stdout != nil {
		out = io.MultiWriter(&stdout, c.Stdout)
	}
	if c.Stderr != nil {
		errOut = io.MultiWriter(&stderr, c.Stderr)
	}
	stdin := c.Stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	line := commandLine(c)
	shown := execx.Cmd{Path: c.Path, Args: c.Args}.String() + " (on " + r.C.RemoteAddr().String() + ")"
	code, err := sshx.Run(ctx, r.C, line, stdin, out, errOut)
	res := execx.Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: code}
	if err != nil {
		return res, &execx.Error{Cmd: shown, ExitCode: -1, Stderr: execx.Tail(stderr.Bytes(), tailKept), Err: err}
	}
	if code != 0 {
		return res, &execx.Error{Cmd: shown, ExitCode: code, Stderr: execx.Tail(stderr.Bytes(), tailKept), Err: fmt.Errorf("exit status %d", code)}
	}
	return res, nil
}

// Start implements execx.Runner by refusing: see Runner.
func (r Runner) Start(d execx.Detached) (execx.Process, error) {
	return nil, errors.New("internal error: a detached program cannot be started over the host link")
}

// LookPath implements execx.Runner: the program's path on the host
// (`command -v`).
func (r Runner) LookPath(name string) (string, error) {
	var out bytes.Buffer
	code, err := sshx.Run(context.Background(), r.C, "command -v "+sshx.Quote([]string{name}), strings.NewReader(""), &out, io.Discard)
	if err != nil {
		return "", err
	}
	p := strings.TrimSpace(out.String())
	if code != 0 || !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%s: not found on %s", name, r.C.RemoteAddr())
	}
	return p, nil
}
