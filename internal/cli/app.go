// Package cli is agent-vm's command line: it builds the urfave/cli App, one
// file per verb, parses flags into option structs and calls one function per
// command: a vm.Manager method, or a command room's function with the
// Manager as its VMs (agent, mcpsync, netpolicy, forward). wire.Open wires
// everything else; a test keeps cli from importing backends or drivers. It maps errors to exit codes
// (0 ok, 1 error, 2 usage, 130 interrupted) and prints them with their hints.
// No business logic lives here.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// Exit codes.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUsage       = 2
	ExitInterrupted = 130
)

// Version is set at build time (-ldflags -X).
var Version = "dev"

// TestHooksTag is the build tag of a binary for the tests, whose egress
// proxy reads its test hooks (egress.TestHooks); `agent-vm version` says
// so after the version ("+testhooks"), which integration-test checks.
const TestHooksTag = "agentvm_testhooks"

// versionLine is what `agent-vm version` prints.
func versionLine() string {
	if egress.TestHooks {
		return "agent-vm " + Version + " +testhooks\n"
	}
	return "agent-vm " + Version + "\n"
}

// usageError is a mistake in how the command was called.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// exitCodeError carries a command's own exit status (exec, shell).
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// IO is where a command reads and writes.
type IO struct {
	In     *os.File
	Out    io.Writer
	Err    io.Writer
	Getenv func(string) string
}

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
	return report(ctx, stdio, err)
}

// report prints err (if any) and returns the exit code for it.
func report(ctx context.Context, stdio IO, err error) int {
	if err == nil {
		return ExitOK
	}
	var code *exitCodeError
	if errors.As(err, &code) {
		return code.code
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		fmt.Fprintf(stdio.Err, "agent-vm: interrupted: %v\n", err)
		return ExitInterrupted
	}
	var u *usageError
	if errors.As(err, &u) {
		fmt.Fprintf(stdio.Err, "agent-vm: %v\n(run `agent-vm --help` for usage)\n", err)
		return ExitUsage
	}
	fmt.Fprintf(stdio.Err, "agent-vm: %v\n", err)
	return ExitError
}

// globals are the parsed global flags.
type globals struct {
	stateDir  string
	verbose   bool
	logFormat string
	noColor   bool
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
			return usagef("%v", err)
		},
		Flags: []cli.Flag{
			// AGENT_VM_STATE_DIR is read in parseGlobals (through stdio.Getenv,
			// and empty as unset), so IsSet means the command line.
			&cli.StringFlag{Name: "state-dir", Usage: "where VM records and workspaces live (default: $AGENT_VM_STATE_DIR, else $XDG_DATA_HOME/agent-vms)"},
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "log debug details"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "log format on stderr: text or json"},
			&cli.BoolFlag{Name: "no-color", Usage: "no colour in logs (also: NO_COLOR)"},
			&cli.BoolFlag{Name: "version", Usage: "print the version"},
			// urfave adds --help only to an App without a command named
			// help, and agent-vm has its own (help.go).
			cli.HelpFlag,
		},
		Before: func(cliCtx *cli.Context) error {
			if err := refuseEmpty(cliCtx, cliCtx.App.Flags); err != nil {
				return err
			}
			if f := cliCtx.String("log-format"); f != "text" && f != "json" {
				return usagef("--log-format %q: must be text or json", f)
			}
			return nil
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
		return usagef("%s: %v", c.Name, err)
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
			return usagef("--%s is empty (hint: give it a value, or leave the flag out for its default)", name)
		}
	}
	return nil
}

// parseGlobals reads the global flags (from any command's context).
func parseGlobals(cliCtx *cli.Context, stdio IO) globals {
	g := globals{
		stateDir:  cliCtx.String("state-dir"),
		verbose:   cliCtx.Bool("verbose"),
		logFormat: cliCtx.String("log-format"),
		noColor:   cliCtx.Bool("no-color") || stdio.Getenv("NO_COLOR") != "",
	}
	if g.stateDir == "" {
		g.stateDir = stdio.Getenv("AGENT_VM_STATE_DIR")
	}
	if g.stateDir == "" {
		g.stateDir = vm.DefaultStateDir(stdio.Getenv)
	}
	return g
}

// newLogger makes the CLI's logger: stderr, no timestamps (a CLI's lines are
// read as they happen), text or JSON.
func newLogger(g globals, w io.Writer) hclog.Logger {
	level := hclog.Info
	if g.verbose {
		level = hclog.Debug
	}
	color := hclog.AutoColor
	if g.noColor {
		color = hclog.ColorOff
	}
	return hclog.New(&hclog.LoggerOptions{
		Name: "agent-vm", Level: level, Output: w, JSONFormat: g.logFormat == "json",
		DisableTime: g.logFormat != "json", Color: color,
	})
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
		return usagef("unknown command %q (did you mean %q?)", prefix+name, prefix+best)
	}
	return usagef("unknown command %q; commands: %s", prefix+name, prefix+strings.Join(names, ", "+prefix))
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
