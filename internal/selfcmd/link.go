package selfcmd

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
func detachCommand(stdio cmdline.IO) *cli.Command {
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
func hostVerbCommand(stdio cmdline.IO) *cli.Command {
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
func workspaceCheckCommand(stdio cmdline.IO) *cli.Command {
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
func workspaceConfigCommand(stdio cmdline.IO) *cli.Command {
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

// hostExecCommand is hostlink.Exec, git's ssh when it fetches from a
// workspace on a libvirt host (hostlink.ExecArgv): the command git asks
// for runs on the host over agent-vm's link. Its standard output is git's
// protocol, so it prints nothing there of its own.
func hostExecCommand(stdio cmdline.IO) *cli.Command {
	flags := []struct{ name, usage string }{
		{"addr", "the host's sshd, `HOST:PORT`"},
		{"user", "the login user on the host"},
		{"key", "agent-vm's private key for the host"},
		{"known-hosts", "the file pinning the host's key"},
	}
	var cflags []cli.Flag
	for _, f := range flags {
		cflags = append(cflags, &cli.StringFlag{Name: f.name, Usage: f.usage})
	}
	return &cli.Command{
		Name: hostlink.ExecCommand, Hidden: true, Usage: "run a command on a libvirt host over agent-vm's link (git's ssh when sync fetches from a workspace there)",
		ArgsUsage: "-- [SSH-ARGS...] COMMAND",
		Flags:     cflags,
		// Its first argument is ssh's, a host name git chose: never the
		// help subcommand urfave/cli would take "h" or "help" for.
		HideHelpCommand: true,
		Action: func(cliCtx *cli.Context) error {
			for _, f := range flags {
				if cliCtx.String(f.name) == "" {
					return cmdline.Usagef("%s needs --%s", hostlink.ExecCommand, f.name)
				}
			}
			t := hostlink.Target{Addr: cliCtx.String("addr"), User: cliCtx.String("user"), KeyFile: cliCtx.String("key"), KnownHosts: cliCtx.String("known-hosts")}
			code, err := hostlink.Exec(cliCtx.Context, t, cliCtx.Args().Slice(), stdio.In, stdio.Out, stdio.Err)
			switch {
			case errors.Is(err, hostlink.ErrNoCommand):
				return cmdline.Usagef("%s: %v", hostlink.ExecCommand, err)
			case err != nil:
				return err
			case code != 0:
				return cmdline.ExitStatus(code)
			}
			return nil
		},
	}
}
