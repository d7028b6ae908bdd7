package hostlink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/sshx"
)

// Runner runs programs on the host over the link: an execx.Runner, so a
// package that runs host programs through one (internal/libvirtnet's virsh
// and nft) acts on the remote host unchanged. Each Run is one SSH session
// running the command line sshx.Quote makes of the argv (with env and cd
// before it), its stdin, stdout and stderr carried over the session.
// A detached program (Start) is started by agent-vm's binary on the host
// (Agent, which Install put there) as `agent-vm __detach`, from the spec it
// reads on its standard input: the program outlives the session, in a
// session of its own, and what it reads on its standard input (the egress
// proxy's secrets) travels in that spec over the SSH channel, never as an
// argument or a file on the host. Without Agent, Start refuses.
type Runner struct {
	C *ssh.Client
	// Agent is agent-vm's binary on the host (Installed.Path); "" for none.
	Agent string
}

// DetachCommand is the verb of agent-vm's binary Start runs on the host
// (the CLI's hidden command of that name).
const DetachCommand = "__detach"

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

// Start implements execx.Runner: the program d is started on the host by
// agent-vm's binary there, detached (see Runner). The Process it returns
// knows only the pid: nothing here sees the program exit, so its Exited
// never closes and the caller watches for what the program makes (a
// socket, a ports file) or checks the pid.
func (r Runner) Start(d execx.Detached) (execx.Process, error) {
	if r.Agent == "" {
		return nil, errors.New("internal error: a detached program is started over the host link only by agent-vm's binary installed there")
	}
	spec, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := r.Run(ctx, execx.Cmd{Path: r.Agent, Args: []string{DetachCommand}, Stdin: bytes.NewReader(spec)})
	if err != nil {
		return nil, fmt.Errorf("starting %s on the host: %w", d.Path, err)
	}
	var out struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(res.Stdout, &out); err != nil || out.Pid <= 0 {
		return nil, fmt.Errorf("starting %s on the host: agent-vm's binary there answered %q, not a pid", d.Path, res.Stdout)
	}
	return remoteProcess{pid: out.Pid}, nil
}

// ErrBadSpec is Detach's standard input that says no program to start.
var ErrBadSpec = errors.New("standard input is not a program to start (the JSON of an execx.Detached with its Path)")

// Detach is DetachCommand, run by agent-vm's binary on the host: it starts
// the program of the execx.Detached it reads as JSON on in, detached (a
// session of its own, outliving the SSH session), and writes {"pid": N} to
// out.
func Detach(in io.Reader, out io.Writer) error {
	b, err := io.ReadAll(io.LimitReader(in, 16<<20))
	if err != nil {
		return err
	}
	var d execx.Detached
	if err := json.Unmarshal(b, &d); err != nil || d.Path == "" {
		return fmt.Errorf("%w: %v", ErrBadSpec, err)
	}
	p, err := (execx.OS{}).Start(d)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "{\"pid\": %d}\n", p.Pid())
	return err
}

// remoteProcess is a program Start started on the host.
type remoteProcess struct{ pid int }

func (p remoteProcess) Pid() int                { return p.pid }
func (p remoteProcess) Exited() <-chan struct{} { return nil }
func (p remoteProcess) ExitCode() int           { return -1 }

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
