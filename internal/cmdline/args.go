package cmdline

import (
	"context"
	"strings"

	"github.com/urfave/cli/v2"
)

// rawArgsKey holds, in the App's metadata, the command line as parsed.
const rawArgsKey = "args"

// Run runs app with args (including the program name) and returns the
// process's exit code: its flags read where they stand (Interspersed), its
// end reported (Report).
func Run(ctx context.Context, app *cli.App, args []string, stdio IO) int {
	args = Interspersed(app, args)
	app.Metadata = map[string]any{rawArgsKey: args}
	return Report(ctx, stdio, app.RunContext(ctx, args))
}

// RawArgs is the command line Run parsed, after Interspersed: what a
// command reads to see where the user typed "--".
func RawArgs(cliCtx *cli.Context) []string {
	raw, _ := cliCtx.App.Metadata[rawArgsKey].([]string)
	return raw
}

// Interspersed moves a command's flags in front of its positional
// arguments, so `agent-vm destroy feature-x --force` means what it says.
// urfave/cli v2 (like Go's flag package) stops reading flags at the first
// positional argument. Flags are recognised by the command's own flag
// definitions, so a flag's value is never mistaken for an argument; "--"
// ends the reordering, and commands that skip flag parsing are left alone.
// Subcommands (`image`, `port`, `sessions rm`) count as commands.
func Interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	i, cmd := 1, (*cli.Command)(nil)
	// Skip the global flags to find the command.
	for i < len(args) {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") {
			if a != "--" {
				cmd = app.Command(a)
			}
			break
		}
		if takesValue(app.Flags, a) {
			i++
		}
		i++
	}
	// A subcommand (`port list BRANCH --json`) is reordered as a command.
	if cmd != nil && len(cmd.Subcommands) > 0 && i+1 < len(args) {
		for _, sub := range cmd.Subcommands {
			if sub.HasName(args[i+1]) {
				cmd, i = sub, i+1
				break
			}
		}
	}
	// A command with subcommands and an action of its own (`sessions
	// BRANCH --json`) is reordered when no subcommand is named.
	if cmd == nil || cmd.SkipFlagParsing || (len(cmd.Subcommands) > 0 && cmd.Action == nil) {
		return args
	}
	head := append([]string{}, args[:i+1]...)
	var flags, rest []string
	j := i + 1
	for ; j < len(args); j++ {
		a := args[j]
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			flags = append(flags, a)
			if takesValue(cmd.Flags, a) && j+1 < len(args) {
				j++
				flags = append(flags, args[j])
			}
			continue
		}
		rest = append(rest, a)
	}
	out := append(head, flags...)
	out = append(out, rest...)
	return append(out, args[j:]...)
}

// takesValue reports whether arg ("--name" or "-n", not "--name=value")
// names a flag in flags that takes a separate value.
func takesValue(flags []cli.Flag, arg string) bool {
	if strings.Contains(arg, "=") {
		return false
	}
	name := strings.TrimLeft(arg, "-")
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			if bf, ok := f.(*cli.BoolFlag); ok && bf != nil {
				return false
			}
			return true
		}
	}
	return false
}
