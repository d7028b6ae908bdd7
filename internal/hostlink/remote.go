package hostlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/sshx"
)

// remote runs commands on one host over the link.
type remote struct {
	ctx context.Context
	c   *ssh.Client
}

// command is a remote command: argv, and how errors show it.
type command struct {
	argv []string
	show string
}

func plain(argv ...string) command { return command{argv: argv, show: sshx.Quote(argv)} }

// script runs body with `sh -c` and args as $1...; named scripts are
// shown by name, short ones as they are.
func script(name, body string, args ...string) command {
	argv := append([]string{"sh", "-c", body, "sh"}, args...)
	show := sshx.Quote(argv)
	if name != "" {
		show = "sh -c <" + name + " script> sh " + sshx.Quote(args)
	}
	return command{argv: argv, show: show}
}

// result is how a remote command ended.
type result struct {
	cmd            string
	code           int
	stdout, stderr string
}

// exec runs cmd through the link's Runner; the error is only for a
// command that could not be run (a non-zero exit is res.code).
func (r remote) exec(stdin io.Reader, cmd command) (result, error) {
	out, err := Runner{C: r.c}.Run(r.ctx, execx.Cmd{Path: cmd.argv[0], Args: cmd.argv[1:], Stdin: stdin})
	res := result{cmd: cmd.show, code: out.ExitCode, stdout: string(out.Stdout), stderr: string(out.Stderr)}
	if ee := (*execx.Error)(nil); err != nil && !(errors.As(err, &ee) && ee.ExitCode > 0) {
		return res, fmt.Errorf("running `%s` on %s: %w (hint: is the link to the host still up?)", cmd.show, r.c.RemoteAddr(), err)
	}
	return res, nil
}

// must runs cmd and returns its stdout; a non-zero exit is an error with
// hint.
func (r remote) must(stdin io.Reader, hint string, cmd command) (string, error) {
	res, err := r.exec(stdin, cmd)
	if err != nil {
		return "", err
	}
	if res.code != 0 {
		return "", r.failed(res, hint)
	}
	return res.stdout, nil
}

// failed says that res's command failed on the host, with its stderr's
// tail.
func (r remote) failed(res result, hint string) error {
	return fmt.Errorf("`%s` exited %d on %s: %s (hint: %s)", res.cmd, res.code, r.c.RemoteAddr(), tail(res.stderr), hint)
}

// tail is the end of a command's stderr, enough to say what went wrong.
func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	t := strings.Join(lines, "; ")
	if len(t) > 500 {
		t = "..." + t[len(t)-500:]
	}
	if t == "" {
		return "no error output"
	}
	return t
}
