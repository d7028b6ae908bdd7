package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/vm"
)

func sshConfigCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "ssh-config",
		Usage:     "print OpenSSH Host blocks for the VMs (all, or one BRANCH)",
		ArgsUsage: "[BRANCH]",
		Description: "Append the output to ~/.ssh/config, then ssh agent-vm-<slug> and editors'\n" +
			"Remote-SSH reach a running VM, checking its pinned host key.",
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if cliCtx.NArg() > 1 {
				return cmdline.Usagef("ssh-config takes at most one BRANCH")
			}
			out, err := m.SSHConfigFor(cliCtx.Context, cliCtx.Args().First())
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(stdio.Out, out)
			return err
		}),
	}
}
