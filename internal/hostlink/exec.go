package hostlink

import (
	"context"
	"errors"
	"io"

	"github.com/agent-vm/agent-vm/internal/sshx"
)

// ExecCommand is the verb of agent-vm's binary that carries one command to
// the host over the link (the CLI's hidden command of that name): git's
// ssh when it fetches from a workspace there (GIT_SSH_COMMAND, ExecArgv),
// so git reaches the host with the pinned key and agent-vm's own key,
// never the user's ssh, its config or agent.
const ExecCommand = "__host-exec"

// ExecArgv is the command line that runs ExecCommand of agent-vm's binary
// agent (a local path) for t, up to its "--": git appends what it passes
// its ssh (a host name, in the simple variant, then the command), and Exec
// runs the last of those. It names the key file, never a secret.
func ExecArgv(agent string, t Target) []string {
	return []string{agent, ExecCommand, "--addr", t.Addr, "--user", t.User, "--key", t.KeyFile, "--known-hosts", t.KnownHosts, "--"}
}

// ErrNoCommand is Exec given nothing to run.
var ErrNoCommand = errors.New("no command to run on the host (the last argument is the command line; those before it, ssh's options and host name, are ignored)")

// Exec is ExecCommand: it opens the link to t and runs the last of args
// there (a command line, which the login user's shell runs, as ssh runs
// one), with stdin, stdout and stderr carried over the session, and
// returns its exit code. Only a failure to run it at all is an error.
func Exec(ctx context.Context, t Target, args []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if len(args) == 0 || args[len(args)-1] == "" {
		return -1, ErrNoCommand
	}
	c, err := Dial(ctx, t)
	if err != nil {
		return -1, err
	}
	defer c.Close()
	return sshx.Run(ctx, c, args[len(args)-1], stdin, stdout, stderr)
}
