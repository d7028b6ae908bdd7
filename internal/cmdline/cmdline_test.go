package cmdline

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// Report's exit codes: none for success, a command's own status as it
// is and silently, 2 for a usage error with the pointer to --help, 130
// once interrupted, else 1.
func TestReport(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		ctx  context.Context
		err  error
		code int
		want string
	}{
		{context.Background(), nil, ExitOK, ""},
		{context.Background(), ExitStatus(3), 3, ""},
		{context.Background(), Usagef("x takes %d", 1), ExitUsage, "agent-vm: x takes 1\n(run `agent-vm --help` for usage)\n"},
		{cancelled, errors.New("stopped"), ExitInterrupted, "agent-vm: interrupted: stopped\n"},
		{context.Background(), errors.New("broken"), ExitError, "agent-vm: broken\n"},
	} {
		var errb bytes.Buffer
		if code := Report(c.ctx, IO{Err: &errb}, c.err); code != c.code || errb.String() != c.want {
			t.Errorf("Report(%v): %d %q, want %d %q", c.err, code, errb.String(), c.code, c.want)
		}
	}
}

// A command's flags are read wherever they stand among its arguments; a
// flag's value and what follows "--" stay where they are.
func TestInterspersed(t *testing.T) {
	app := &cli.App{Name: "p", Flags: []cli.Flag{&cli.StringFlag{Name: "dir"}}, Commands: []*cli.Command{
		{Name: "rm", Flags: []cli.Flag{&cli.BoolFlag{Name: "force"}, &cli.IntFlag{Name: "n"}}},
		{Name: "group", Subcommands: []*cli.Command{{Name: "sub", Flags: []cli.Flag{&cli.BoolFlag{Name: "json"}}}}},
		{Name: "exec", SkipFlagParsing: true},
	}}
	for in, want := range map[string]string{
		"p rm x --force":           "p rm --force x",
		"p --dir /d rm x -n 5 y":   "p --dir /d rm -n 5 x y",
		"p rm x -- y --force":      "p rm x -- y --force",
		"p group sub x --json":     "p group sub --json x",
		"p exec x --force":         "p exec x --force",
		"p rm --force=true x -n 1": "p rm --force=true -n 1 x",
	} {
		if got := strings.Join(Interspersed(app, strings.Fields(in)), " "); got != want {
			t.Errorf("%s\n got %s\nwant %s", in, got, want)
		}
	}
}

// An unknown command is named with the nearest known, visible one.
func TestUnknownCommand(t *testing.T) {
	cmds := []*cli.Command{{Name: "list"}, {Name: "destroy"}, {Name: "__hidden", Hidden: true}}
	for name, want := range map[string]string{
		"lsit":    `unknown command "lsit" (did you mean "list"?)`,
		"des":     `unknown command "des" (did you mean "destroy"?)`,
		"__hidde": `unknown command "__hidde"; commands: destroy, list`,
	} {
		if got := UnknownCommand(cmds, "", name).Error(); got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
}
