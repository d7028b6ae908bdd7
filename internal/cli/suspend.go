package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
)

func suspendCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:         "suspend",
		Usage:        "keep a running VM's memory and stop its guest from running; `agent-vm resume` continues it",
		ArgsUsage:    "[BRANCH]",
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			info, err := m.Suspend(cliCtx.Context, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdio.Out, "suspended the VM of branch %s: %s\n", info.Branch, info.Detail)
			return nil
		}),
	}
}

func resumeCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:         "resume",
		Usage:        "continue a suspended VM",
		ArgsUsage:    "[BRANCH]",
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			info, err := m.Resume(cliCtx.Context, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdio.Out, "resumed the VM of branch %s (agent: %s)\n", info.Branch, info.Agent.State)
			return nil
		}),
	}
}
