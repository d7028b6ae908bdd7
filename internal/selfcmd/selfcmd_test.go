package selfcmd

import (
	"bytes"
	"context"
	"maps"
	"os"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// These tests run the commands as agent-vm's binary does: in process, with
// buffers, through an App of this package's commands held to cmdline's
// grammar and ended by its Report; or as the built binary where processes
// matter (a drop of privileges, a process that outlives its QEMU). Nothing
// is faked but the host's opener of URLs.

type result struct {
	code   int
	stdout string
	stderr string
}

// run runs `agent-vm ARGS...` in process with in as its standard input
// (nil: the test's) and env as its environment, over NO_COLOR.
func run(t *testing.T, in *os.File, env map[string]string, args ...string) result {
	t.Helper()
	if in == nil {
		in = os.Stdin
	}
	vars := map[string]string{"NO_COLOR": "1"}
	maps.Copy(vars, env)
	var out, errb bytes.Buffer
	stdio := cmdline.IO{In: in, Out: &out, Err: &errb, Getenv: func(k string) string { return vars[k] }}
	app := &cli.App{Name: "agent-vm", Writer: &out, ErrWriter: &errb, Flags: cmdline.LogFlags(), Commands: Commands(stdio)}
	cmdline.Shape(app)
	code := cmdline.Run(context.Background(), app, append([]string{"agent-vm"}, args...), stdio)
	return result{code, out.String(), errb.String()}
}

// The hidden commands keep the grammar of every command: a flag they do
// not have, or an empty value, is a usage error, exit 2, naming it.
func TestHiddenCommandsKeepTheGrammar(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{hostlink.DetachCommand, "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"__hold", "--vm-dir", ""}, "--vm-dir is empty"},
		{[]string{"__net-forward", "--forward", "2222=10.0.0.2:22", "extra"}, "takes no arguments"},
	} {
		r := run(t, nil, nil, c.args...)
		if r.code != cmdline.ExitUsage || r.stdout != "" || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-vm %q: exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 2 and %q", c.args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}

// TestMain removes the agent-vm binary the tests built, once they are done.
func TestMain(m *testing.M) {
	code := m.Run()
	tu.RemoveAgentVMBinary()
	os.Exit(code)
}
