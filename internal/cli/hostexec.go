package cli

import (
	"errors"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/hostlink"
)

// hostExecCommand is hostlink.Exec, git's ssh when it fetches from a
// workspace on a libvirt host (hostlink.ExecArgv): the command git asks
// for runs on the host over agent-vm's link. Its standard output is git's
// protocol, so it prints nothing there of its own.
func hostExecCommand(stdio IO) *cli.Command {
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
