package selfcmd

import (
	"bytes"
	"context"
	"maps"
	"os"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// These tests run the commands as agent-vm's binary does: in process, with
// buffers, through an App of this package's commands ended by
// cmdline.Report; or as the built binary where processes matter (a drop of
// privileges, a process that outlives its QEMU). Nothing is faked but the
// host's opener of URLs.

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
	app := &cli.App{Name: "agent-vm", Writer: &out, ErrWriter: &errb, ExitErrHandler: func(*cli.Context, error) {},
		Flags: cmdline.LogFlags(), Commands: Commands(stdio)}
	ctx := context.Background()
	code := cmdline.Report(ctx, stdio, app.RunContext(ctx, append([]string{"agent-vm"}, args...)))
	return result{code, out.String(), errb.String()}
}

// TestMain removes the agent-vm binary the tests built, once they are done.
func TestMain(m *testing.M) {
	code := m.Run()
	tu.RemoveAgentVMBinary()
	os.Exit(code)
}
