package cli

import (
	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/personalize"
)

// personalizeCommand runs in a guest restored from a template, as root:
// it applies the plan on its standard input, which makes the guest one
// VM (internal/personalize; a start runs it over SSH).
func personalizeCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: personalize.Command, Hidden: true, Usage: "in a guest restored from a template: become one VM (agent-vm start runs it over SSH, as root)",
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			return personalize.ApplyHere(cliCtx.Context, stdio.In)
		},
	}
}
