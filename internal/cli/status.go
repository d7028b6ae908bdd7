package cli

import (
	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
)

func statusCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:         "status",
		Usage:        "show a VM's record and live state",
		ArgsUsage:    "[BRANCH]",
		Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON (fields documented in docs/usage.md)"}},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			en, err := m.Find(cliCtx.Context, name)
			if err != nil {
				return err
			}
			info := m.Status(cliCtx.Context, en, true)
			if cliCtx.Bool("json") {
				return writeJSON(stdio.Out, info)
			}
			info.WriteText(stdio.Out)
			return nil
		}),
	}
}
