package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
)

// The --help categories, in the order --help shows them.
var categories = []string{"VMs", "Agents", "Network", "Images and templates", "Host"}

// commands lists the verbs. A verb is listed only once it works. --help
// groups them by category (appHelpTemplate keeps the categories' order);
// the hidden ones are what agent-vm runs itself, in the guest or beside
// QEMU.
func commands(stdio IO) []*cli.Command {
	return slices.Concat(
		category("VMs", createCommand(stdio), startCommand(stdio), stopCommand(stdio), restartCommand(stdio),
			destroyCommand(stdio), syncCommand(stdio), statusCommand(stdio), listCommand(stdio), suspendCommand(stdio),
			resumeCommand(stdio), resetCommand(stdio), logsCommand(stdio), sshConfigCommand(stdio),
			shellCommand(stdio), execCommand(stdio)),
		category("Agents", runCommand(stdio), attachCommand(stdio), sessionsCommand(stdio),
			mcpCommand(stdio), mcpConfigCommand(stdio), secretCommand(stdio)),
		category("Network", netCommand(stdio), portCommand(stdio), exposeCommand(stdio), browserCommand(stdio)),
		category("Images and templates", imageCommand(stdio), templateCommand(stdio)),
		category("Host", setupCommand(stdio), doctorCommand(stdio), hostCommand(stdio), completionCommand(stdio), helpCommand(stdio),
			&cli.Command{
				Name: "version", Usage: "print the version",
				Action: func(*cli.Context) error { _, err := fmt.Fprint(stdio.Out, versionLine()); return err },
			}),
		[]*cli.Command{mcpProxyCommand(stdio), netProxyCommand(stdio), netRelayCommand(stdio), netForwardCommand(stdio), detachCommand(stdio), hostVerbCommand(stdio), hostExecCommand(stdio), workspaceCheckCommand(stdio), workspaceConfigCommand(stdio),
			holdCommand(stdio), personalizeCommand(stdio), openURLCommand(stdio)},
	)
}

// category puts cmds in the --help category name, one of categories.
func category(name string, cmds ...*cli.Command) []*cli.Command {
	if !slices.Contains(categories, name) {
		panic("internal error: --help category " + name + " is not in categories")
	}
	for _, c := range cmds {
		c.Category = name
	}
	return cmds
}

// vmName returns the VM a command is about: its BRANCH argument, or the
// branch checked out where agent-vm runs.
func vmName(cliCtx *cli.Context, m *vm.Manager) (string, error) {
	switch cliCtx.NArg() {
	case 0:
		return currentBranch(cliCtx, m)
	case 1:
		return cliCtx.Args().First(), nil
	default:
		return "", usagef("%s takes at most one BRANCH, got %d arguments", cliCtx.Command.Name, cliCtx.NArg())
	}
}

// currentBranch is the branch checked out where agent-vm runs.
func currentBranch(cliCtx *cli.Context, m *vm.Manager) (string, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	top, err := m.Git.Toplevel(cliCtx.Context, cwd)
	if err != nil {
		return "", usagef("no BRANCH given and %s is not in a git checkout (hint: agent-vm %s BRANCH; `agent-vm list` shows the VMs)", cwd, cliCtx.Command.Name)
	}
	return m.Git.CurrentBranch(cliCtx.Context, top)
}

// writeJSON prints v as indented JSON on stdout.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// noArgs refuses positional arguments.
func noArgs(cliCtx *cli.Context) error {
	if cliCtx.NArg() > 0 {
		return usagef("%s takes no arguments, got %q", cliCtx.Command.Name, cliCtx.Args().Slice())
	}
	return nil
}

// withManager wraps an action that needs the environment and a Manager.
func withManager(stdio IO, f func(cliCtx *cli.Context, e *env, m *vm.Manager) error) cli.ActionFunc {
	return func(cliCtx *cli.Context) error {
		e := newEnv(cliCtx, stdio)
		m, err := e.manager()
		if err != nil {
			return err
		}
		return f(cliCtx, e, m)
	}
}

// vmCompletion completes BRANCH arguments with the VMs' branches.
func vmCompletion(stdio IO) cli.BashCompleteFunc {
	return func(cliCtx *cli.Context) {
		if cliCtx.NArg() > 0 {
			return
		}
		m, err := newEnv(cliCtx, stdio).manager()
		if err != nil {
			return
		}
		entries, _ := m.List(cliCtx.Context)
		for _, e := range entries {
			if e.Record != nil {
				fmt.Fprintln(stdio.Out, e.Record.Branch)
			}
		}
	}
}
