package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/selfcmd"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// The --help categories, in the order --help shows them.
var categories = []string{"VMs", "Agents", "Network", "Images and templates", "Host"}

// commands lists the verbs. A verb is listed only once it works. --help
// groups them by category (appHelpTemplate keeps the categories' order).
// The hidden ones are what agent-vm runs of itself (selfcmd), and expose,
// a user's old spelling of port expose.
func commands(stdio IO) []*cli.Command {
	return slices.Concat(
		category("VMs", createCommand(stdio), startCommand(stdio), stopCommand(stdio), restartCommand(stdio),
			destroyCommand(stdio), forkCommand(stdio), checkpointCommand(stdio), rollbackCommand(stdio), syncCommand(stdio), statusCommand(stdio), listCommand(stdio), topCommand(stdio), suspendCommand(stdio),
			resumeCommand(stdio), resetCommand(stdio), logsCommand(stdio), sshConfigCommand(stdio),
			shellCommand(stdio), execCommand(stdio)),
		category("Agents", runCommand(stdio), attachCommand(stdio), sessionsCommand(stdio),
			mcpCommand(stdio), mcpConfigCommand(stdio), secretCommand(stdio)),
		category("Network", netCommand(stdio), portCommand(stdio), exposeCommand(stdio), browserCommand(stdio)),
		category("Images and templates", imageCommand(stdio), templateCommand(stdio)),
		category("Host", setupCommand(stdio), doctorCommand(stdio), hostCommand(stdio), completionCommand(stdio), cmdline.HelpCommand(stdio),
			&cli.Command{
				Name: "version", Usage: "print the version",
				Action: func(*cli.Context) error { _, err := fmt.Fprint(stdio.Out, versionLine()); return err },
			}),
		selfcmd.Commands(stdio),
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
		return "", cmdline.Usagef("%s takes at most one BRANCH, got %d arguments", commandPath(cliCtx), cliCtx.NArg())
	}
}

// currentBranch is the branch checked out where agent-vm runs.
func currentBranch(cliCtx *cli.Context, m *vm.Manager) (string, error) {
	return checkedOut(cliCtx, m, commandPath(cliCtx)+" BRANCH")
}

// checkedOut is the branch checked out where agent-vm runs; spelling is
// how the command names a VM, for the hint when there is none.
func checkedOut(cliCtx *cli.Context, m *vm.Manager, spelling string) (string, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	top, err := m.Git.Toplevel(cliCtx.Context, cwd)
	if err != nil {
		return "", cmdline.Usagef("no BRANCH given and %s is not in a git checkout (hint: agent-vm %s; agent-vm list shows the VMs)", cwd, spelling)
	}
	return m.Git.CurrentBranch(cliCtx.Context, top)
}

// commandPath is the words that name the running command below agent-vm
// ("net allow", "status").
func commandPath(cliCtx *cli.Context) string {
	var words []string
	for _, c := range cliCtx.Lineage() {
		if c.Command != nil && c.Command.Name != "" && c.Command.Name != cliCtx.App.Name {
			words = append([]string{c.Command.Name}, words...)
		}
	}
	return strings.Join(words, " ")
}

// The VM a command acts on. A command whose only positional argument is
// the VM takes it as an optional BRANCH (status [BRANCH]). A command with
// positional arguments of its own (net allow DOMAIN..., port add
// GUEST_PORT [HOST_PORT]) takes it as --vm BRANCH instead: an optional
// BRANCH in front of them could not be told from them (a branch may be
// called example.com or 8080). Either way, left out, it is the branch
// checked out where agent-vm runs.

// vmFlag is --vm of a command with positional arguments of its own.
func vmFlag() cli.Flag {
	return &cli.StringFlag{Name: "vm", Usage: "the VM of `BRANCH` (default: the checked-out branch)"}
}

// vmAndArgs returns the VM a command that takes --vm acts on, and its
// positional arguments. oldForm (if not nil) says whether args are the
// spelling that led with BRANCH before --vm existed; it still works, with
// a deprecation note on stderr.
func vmAndArgs(cliCtx *cli.Context, stdio IO, m *vm.Manager, oldForm func(args []string) bool) (string, []string, error) {
	args := cliCtx.Args().Slice()
	path := commandPath(cliCtx)
	if cliCtx.IsSet("vm") {
		return cliCtx.String("vm"), args, nil
	}
	if oldForm != nil && len(args) > 0 && oldForm(args) {
		fmt.Fprintf(stdio.Err, "agent-vm: %s BRANCH ... is deprecated; write %s --vm %s ... (or leave --vm out for the checked-out branch)\n", path, path, args[0])
		return args[0], args[1:], nil
	}
	name, err := checkedOut(cliCtx, m, path+" --vm BRANCH ...")
	return name, args, err
}

// twoWords is the old spelling of a command that takes one argument of its
// own: BRANCH and that argument.
func twoWords(args []string) bool { return len(args) == 2 }

// vmAndPort is vmAndArgs for a command whose one argument is a port,
// named what in errors (GUEST_PORT, HOST_PORT).
func vmAndPort(cliCtx *cli.Context, stdio IO, m *vm.Manager, what string) (string, int, error) {
	name, args, err := vmAndArgs(cliCtx, stdio, m, twoWords)
	if err != nil {
		return "", 0, err
	}
	port, err := portArg(args, 0, what)
	return name, port, err
}

// writeJSON prints v as indented JSON on stdout.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
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
