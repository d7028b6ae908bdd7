package selfcmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// The hidden __host-exec, git's ssh for a workspace on a libvirt host
// (here this machine's sshd stand-in): it runs the last argument on the
// host, ignoring the ssh options and host name before it, with its
// standard input and output, and exits with its code; without a flag or a
// command it is a usage error, and a host it cannot reach an error that
// names it. Nothing of its own goes to standard output, which is git's.
func TestHostExec(t *testing.T) {
	srv := sshdtest.New(t)
	srv.Start()
	argv := hostlink.ExecArgv("agent-vm", hostlink.Target{Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts})[1:]
	in := filepath.Join(t.TempDir(), "in")
	tu.WriteFile(t, in, "over the link\n")
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := run(t, f, nil, append(argv, "-o", "SendEnv=GIT_PROTOCOL", "agent-vm-host", `cat; echo "to stderr" >&2; exit 3`)...)
	if r.code != 3 || r.stdout != "over the link\n" || r.stderr != "to stderr\n" {
		t.Errorf("a command on the host: exit %d, stdout %q, stderr %q; want 3, its stdin, its stderr", r.code, r.stdout, r.stderr)
	}

	unreachable := fmt.Sprintf("127.0.0.1:%d", tu.FreePort(t))
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{argv[:len(argv)-1], cmdline.ExitUsage, "no command to run on the host"},
		{append(append([]string{}, argv...), "agent-vm-host", ""), cmdline.ExitUsage, "no command to run on the host"},
		{[]string{hostlink.ExecCommand, "--user", "root", "--key", srv.KeyFile, "--known-hosts", srv.KnownHosts, "--", "h", "true"}, cmdline.ExitUsage, "needs --addr"},
		{[]string{hostlink.ExecCommand, "--addr", srv.Addr, "--user", "root", "--key", srv.KeyFile, "--", "h", "true"}, cmdline.ExitUsage, "needs --known-hosts"},
		{[]string{hostlink.ExecCommand, "--addr", unreachable, "--user", "root", "--key", srv.KeyFile, "--known-hosts", srv.KnownHosts, "--", "h", "true"}, cmdline.ExitError, "reaching " + unreachable + " over SSH"},
	} {
		r := run(t, nil, nil, c.args...)
		if r.code != c.code || r.stdout != "" || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d and %q", c.args, r.code, r.stdout, r.stderr, c.code, c.want)
		}
	}
}
