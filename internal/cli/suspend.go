package cli

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
)

func suspendCommand(stdio IO) *cli.Command {
	return driverVerbCommand(stdio, "suspend", "keep a running VM's memory and stop its guest from running; `agent-vm resume` continues it",
		(*vm.Manager).Suspend, func(i *vm.Info) string { return fmt.Sprintf("suspended the VM of branch %s: %s", i.Branch, i.Detail) })
}

func resumeCommand(stdio IO) *cli.Command {
	return driverVerbCommand(stdio, "resume", "continue a suspended VM",
		(*vm.Manager).Resume, func(i *vm.Info) string { return fmt.Sprintf("resumed the VM of branch %s (agent: %s)", i.Branch, i.Agent.State) })
}

// driverVerbCommand is a verb on one VM that prints one line of its status.
func driverVerbCommand(stdio IO, name, usage string, verb func(*vm.Manager, context.Context, string) (*vm.Info, error), done func(*vm.Info) string) *cli.Command {
	return &cli.Command{
		Name: name, Usage: usage, ArgsUsage: "[BRANCH]", BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			branch, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			info, err := verb(m, cliCtx.Context, branch)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdio.Out, done(info))
			return nil
		}),
	}
}
