// Package cli is agent-vm's command line: it builds the urfave/cli App, one
// file per verb, parses flags into option structs and calls one function per
// command: a vm.Manager method, or a command room's function with the
// Manager as its VMs (agent, mcpsync, netpolicy, forward). wire.Open wires
// everything else; a test keeps cli from importing backends or drivers.
// cmdline.Report maps its errors to exit codes (0 ok, 1 error, 2 usage,
// 130 interrupted) and prints them with their hints. No business logic
// lives here.
package cli

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// Version is set at build time (-ldflags -X).
var Version = "dev"

// versionLine is what `agent-vm version` prints.
func versionLine() string {
	if egress.TestHooks {
		return "agent-vm " + Version + " +testhooks\n"
	}
	return "agent-vm " + Version + "\n"
}

// IO is where a command reads and writes.
type IO = cmdline.IO

// Main runs agent-vm with args (including the program name) and returns
// the process exit code. ctx is cancelled on SIGINT/SIGTERM.
func Main(ctx context.Context, args []string, stdio IO) int {
	if stdio.Getenv == nil {
		stdio.Getenv = os.Getenv
	}
	app := newApp(stdio)
	args = interspersed(app, args)
	app.Metadata = map[string]any{rawArgsKey: args}
	err := app.RunContext(ctx, args)
	return cmdline.Report(ctx, stdio, err)
}

// appHelpTemplate is urfave's help with the command categories in the
// order of categories: urfave sorts them by name, which put VMs last.
func appHelpTemplate() string {
	var b strings.Builder
	for _, c := range categories {
		fmt.Fprintf(&b, `{{range .VisibleCategories}}{{if eq .Name %q}}
   {{.Name}}:{{range .VisibleCommands}}
     {{join .Names ", "}}{{"\t"}}{{.Usage}}{{end}}{{end}}{{end}}`, c)
	}
	const sorted = `{{template "visibleCommandCategoryTemplate" .}}`
	if !strings.Contains(cli.AppHelpTemplate, sorted) {
		panic("internal error: urfave's AppHelpTemplate has no command categories to order")
	}
	return strings.Replace(cli.AppHelpTemplate, sorted, b.String(), 1)
}

func newApp(stdio IO) *cli.App {
	app := &cli.App{
		Name:                  "agent-vm",
		Usage:                 "one isolated VM per git branch, for coding agents",
		Version:               Version,
		Writer:                stdio.Out,
		ErrWriter:             stdio.Err,
		EnableBashCompletion:  true,
		HideHelpCommand:       true,
		HideVersion:           true, // its -v alias would clash with --verbose; see the version command
		CustomAppHelpTemplate: appHelpTemplate(),
		// A repeatable flag takes one value per use: a comma is part of the
		// value (and reaches its validator), not a separator.
		DisableSliceFlagSeparator: true,
		ExitErrHandler:            func(*cli.Context, error) {}, // we map errors ourselves
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return cmdline.Usagef("%v", err)
		},
		// AGENT_VM_STATE_DIR is read in stateDir (through stdio.Getenv, and
		// empty as unset), so IsSet means the command line. urfave adds
		// --help only to an App without a command named help, and agent-vm
		// has its own (help.go).
		Flags: slices.Concat([]cli.Flag{
			&cli.StringFlag{Name: "state-dir", Usage: "where VM records and workspaces live (default: $AGENT_VM_STATE_DIR, else $XDG_DATA_HOME/agent-vms)"},
		}, cmdline.LogFlags(), []cli.Flag{&cli.BoolFlag{Name: "version", Usage: "print the version"}, cli.HelpFlag}),
		Before: func(cliCtx *cli.Context) error {
			if err := refuseEmpty(cliCtx, cliCtx.App.Flags); err != nil {
				return err
			}
			return cmdline.CheckLogFormat(cliCtx)
		},
		Action: func(cliCtx *cli.Context) error {
			if cliCtx.Bool("version") {
				_, err := fmt.Fprint(stdio.Out, versionLine())
				return err
			}
			if cliCtx.Args().Present() {
				return unknownCommand(cliCtx.App.Commands, "", cliCtx.Args().First())
			}
			return cli.ShowAppHelp(cliCtx)
		},
	}
	app.Commands = commands(stdio)
	noBoolDefaults(app.Flags)
	plainDefaults(app.Flags)
	for _, c := range app.Commands {
		setUsageHandlers(c)
	}
	app.CommandNotFound = func(cliCtx *cli.Context, name string) {
		// Only reached for unknown subcommands of a command; report it.
		fmt.Fprintln(stdio.Err, unknownCommand(cliCtx.App.Commands, "", name))
	}
	return app
}

func setUsageHandlers(c *cli.Command) {
	if len(c.Subcommands) > 0 {
		// A group's help lists its own subcommands, not urfave's `help`
		// (`agent-vm help GROUP SUB` is the top-level help command's).
		c.HideHelpCommand = true
		if act := c.Action; act == nil {
			c.Action = groupAction(c)
		} else {
			// A group that does something itself (sessions [BRANCH])
			// still takes help as its first word, as every group does.
			help := groupAction(c)
			c.Action = func(cliCtx *cli.Context) error {
				if cliCtx.Args().First() == "help" {
					return help(cliCtx)
				}
				return act(cliCtx)
			}
		}
	}
	if len(c.Subcommands) == 0 && strings.HasPrefix(c.ArgsUsage, "[BRANCH]") && c.Action != nil {
		c.Action = helpWord(c.Action)
	}
	noBoolDefaults(c.Flags)
	plainDefaults(c.Flags)
	c.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
		return cmdline.Usagef("%s: %v", c.Name, err)
	}
	before := c.Before
	c.Before = func(cliCtx *cli.Context) error {
		if err := refuseEmpty(cliCtx, c.Flags); err != nil {
			return err
		}
		if before != nil {
			return before(cliCtx)
		}
		return nil
	}
	for _, sub := range c.Subcommands {
		setUsageHandlers(sub)
	}
}

// noBoolDefaults drops urfave's "(default: false)" from the help of
// boolean flags: a switch is off unless given.
func noBoolDefaults(flags []cli.Flag) {
	for _, f := range flags {
		if b, ok := f.(*cli.BoolFlag); ok && !b.DisableDefaultText {
			b.DisableDefaultText = true
		}
	}
}

// plainDefaults prints a string flag's default as every other default is
// printed, "(default: auto)", not urfave's quoted "(default: \"auto\")".
func plainDefaults(flags []cli.Flag) {
	for _, f := range flags {
		if s, ok := f.(*cli.StringFlag); ok && s.Value != "" && s.DefaultText == "" {
			s.DefaultText = s.Value
		}
	}
}

// refuseEmpty is a usage error for a string flag given an empty value on
// the command line (--branch ""), which would otherwise silently mean the
// flag's default.
func refuseEmpty(cliCtx *cli.Context, flags []cli.Flag) error {
	for _, f := range flags {
		if _, ok := f.(*cli.StringFlag); !ok {
			continue
		}
		name := f.Names()[0]
		if cliCtx.IsSet(name) && cliCtx.String(name) == "" {
			return cmdline.Usagef("--%s is empty (hint: give it a value, or leave the flag out for its default)", name)
		}
	}
	return nil
}

// stateDir is the state directory the global flags and the environment
// name (from any command's context).
func stateDir(cliCtx *cli.Context, stdio IO) string {
	if d := cliCtx.String("state-dir"); d != "" {
		return d
	}
	if d := stdio.Getenv("AGENT_VM_STATE_DIR"); d != "" {
		return d
	}
	return vm.DefaultStateDir(stdio.Getenv)
}

// unknownCommand says a command (a subcommand of parent, when given) does
// not exist among cmds, suggesting the nearest.
func unknownCommand(cmds []*cli.Command, parent, name string) error {
	var names []string
	for _, c := range cmds {
		if !c.Hidden {
			names = append(names, c.Name)
		}
	}
	sort.Strings(names)
	prefix := ""
	if parent != "" {
		prefix = parent + " "
	}
	if best := nearest(name, names); best != "" {
		return cmdline.Usagef("unknown command %q (did you mean %q?)", prefix+name, prefix+best)
	}
	return cmdline.Usagef("unknown command %q; commands: %s", prefix+name, prefix+strings.Join(names, ", "+prefix))
}

// nearest returns the candidate closest to s by edit distance, if close.
func nearest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	for _, c := range candidates {
		d := editDistance(s, c)
		if strings.HasPrefix(c, s) && len(s) >= 2 {
			d = 1
		}
		if d < bestD {
			best, bestD = c, d
		}
	}
	if bestD <= max(2, len(s)/3) {
		return best
	}
	return ""
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
