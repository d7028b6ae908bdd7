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
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/wire"
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
	return cmdline.Run(ctx, newApp(stdio), args, stdio)
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
		// AGENT_VM_STATE_DIR is read in stateDir (through stdio.Getenv, and
		// empty as unset), so IsSet means the command line. urfave adds
		// --help only to an App without a command named help, and agent-vm
		// has its own (cmdline.HelpCommand).
		Flags: slices.Concat([]cli.Flag{
			&cli.StringFlag{Name: "state-dir", Usage: "where VM records and workspaces live (default: $AGENT_VM_STATE_DIR, else $XDG_DATA_HOME/agent-vms)"},
		}, cmdline.LogFlags(), []cli.Flag{&cli.BoolFlag{Name: "version", Usage: "print the version"}, cli.HelpFlag}),
		Before: cmdline.CheckLogFormat,
		Action: func(cliCtx *cli.Context) error {
			if cliCtx.Bool("version") {
				_, err := fmt.Fprint(stdio.Out, versionLine())
				return err
			}
			if cliCtx.Args().Present() {
				return cmdline.UnknownCommand(cliCtx.App.Commands, "", cliCtx.Args().First())
			}
			return cli.ShowAppHelp(cliCtx)
		},
	}
	app.Commands = commands(stdio)
	cmdline.Shape(app)
	return app
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
	return wire.DefaultStateDir(stdio.Getenv)
}
