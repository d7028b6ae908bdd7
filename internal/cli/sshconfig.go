package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vm"
)

func sshConfigCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "ssh-config",
		Usage:     "print OpenSSH Host blocks for the VMs (all, or one BRANCH)",
		ArgsUsage: "[BRANCH]",
		Description: "Append the output to ~/.ssh/config, then `ssh agent-vm-<slug>` and editors'\n" +
			"Remote-SSH reach a running VM, checking its pinned host key.",
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			var entries []state.Entry
			switch cliCtx.NArg() {
			case 0:
				all, err := m.List(cliCtx.Context)
				if err != nil {
					return err
				}
				entries = all
			case 1:
				en, err := m.Find(cliCtx.Context, cliCtx.Args().First())
				if err != nil {
					return err
				}
				if en.Record == nil {
					return en.Err
				}
				entries = []state.Entry{en}
			default:
				return usagef("ssh-config takes at most one BRANCH")
			}
			_, err := fmt.Fprint(stdio.Out, vm.SSHConfig(entries))
			return err
		}),
	}
}
