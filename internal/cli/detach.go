package cli

import (
	"errors"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/placement"
	"github.com/agent-vm/agent-vm/internal/wire"
)

// detachCommand is hostlink.Detach, agent-vm's binary on a libvirt host
// starting what must outlive the SSH session that asked for it.
func detachCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: hostlink.DetachCommand, Hidden: true, Usage: "start a detached program from the spec on standard input (agent-vm runs it on a libvirt host over its link)",
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			if err := hostlink.Detach(stdio.In, stdio.Out); err != nil {
				if errors.Is(err, hostlink.ErrBadSpec) {
					return cmdline.Usagef("%s: %v", hostlink.DetachCommand, err)
				}
				return err
			}
			return nil
		},
	}
}

// hostVerbCommand serves one request of the libvirt driver for a VM placed
// on this machine from another (wire.ServeHost): JSON in, JSON out.
func hostVerbCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: wire.HostCommand, Hidden: true, Usage: "serve one request of agent-vm's libvirt driver for a VM placed on this machine (agent-vm runs it over its link)",
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			log := hclog.New(&hclog.LoggerOptions{Name: "agent-vm", Output: stdio.Err, Level: hclog.Info, Color: hclog.ColorOff})
			return wire.ServeHost(cliCtx.Context, stdio.In, stdio.Out, log)
		},
	}
}

// workspaceCheckCommand is placement.CheckWorkspace: on a VM's host, the unsaved
// work of the workspace there, as JSON, for destroy on the machine that
// asks.
func workspaceCheckCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: placement.WorkspaceCheckCommand, Hidden: true, Usage: "print the unsaved work of a VM's workspace on this machine as JSON (agent-vm runs it on a VM's host over its link)",
		Flags: []cli.Flag{&cli.StringFlag{Name: "workspace", Required: true, Usage: "the workspace's path"}},
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			return placement.CheckWorkspace(cliCtx.Context, cliCtx.String("workspace"), stdio.Out)
		},
	}
}

// workspaceConfigCommand is placement.ReadWorkspaceConfig: on a VM's host, the
// repository's settings file in the workspace there, as JSON.
func workspaceConfigCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: placement.WorkspaceConfigCommand, Hidden: true, Usage: "print a VM's workspace's agent-vm settings file on this machine as JSON (agent-vm runs it on a VM's host over its link)",
		Flags: []cli.Flag{&cli.StringFlag{Name: "workspace", Required: true, Usage: "the workspace's path"}},
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			return placement.ReadWorkspaceConfig(cliCtx.String("workspace"), stdio.Out)
		},
	}
}
