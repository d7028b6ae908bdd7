package selfcmd

import (
	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/guestconn"
	"github.com/agent-vm/agent-vm/internal/hold"
)

// holdCommand is a VM's holder, which start runs detached once the guest
// answers SSH: one held connection to the guest, served on a unix socket
// in the VM's run directory (see guestconn.ServeDir).
func holdCommand(stdio cmdline.IO) *cli.Command {
	return &cli.Command{
		Name: hold.Command, Hidden: true, Usage: "hold a connection to a VM's guest for the commands that reach it (agent-vm starts it with the VM)",
		Flags: []cli.Flag{&cli.StringFlag{Name: "vm-dir", Usage: "the VM's directory in the state directory"}},
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			if cliCtx.String("vm-dir") == "" {
				return cmdline.Usagef("%s needs --vm-dir", hold.Command)
			}
			return guestconn.ServeDir(cliCtx.Context, cliCtx.String("vm-dir"), cmdline.ServiceLogger(cliCtx, stdio).Named("hold"))
		},
	}
}
