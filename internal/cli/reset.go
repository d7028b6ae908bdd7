package cli

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/vm"
)

func resetCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "reset",
		Usage:     "give a VM a fresh root disk from its base image; its next start provisions it again",
		ArgsUsage: "[BRANCH]",
		Description: "Throws away everything outside /workspace: the VM's next start boots a new root disk and\n" +
			"provisions it as on its first boot (the packages of create --packages and of the workspace's\n" +
			".agent-vm/config.toml as it is now, then its .agent-vm/provision.sh). The workspace (a\n" +
			"directory on the host), the SSH keys (so the pinned host key), the ports and the rest of the\n" +
			"VM's settings stay. A running VM is refused unless --force, which stops it first.",
		Flags:        []cli.Flag{&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "stop the VM first if it runs"}},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			res, err := m.Reset(cliCtx.Context, name, vm.ResetOptions{Force: cliCtx.Bool("force")})
			if err != nil {
				return err
			}
			verb := "reset"
			if res.Stopped {
				verb = "stopped and reset"
			}
			fmt.Fprintf(stdio.Out, "%s the VM of branch %s: its next start boots a fresh disk and provisions it\n", verb, res.Branch)
			if len(res.Packages) > 0 {
				fmt.Fprintf(stdio.Out, "  packages: %s\n", strings.Join(res.Packages, " "))
			}
			fmt.Fprintf(stdio.Out, "next: agent-vm start %s\n", res.Slug)
			return nil
		}),
	}
}

// packagesFlag reads --packages: repeatable, and each value may list several
// names separated by commas (no package name of either backend holds one),
// so `--packages a,b` and `--packages a --packages b` are the same.
func packagesFlag(cliCtx *cli.Context) ([]string, error) {
	var out []string
	for _, v := range cliCtx.StringSlice("packages") {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			if p == "" {
				return nil, cmdline.Usagef("--packages %q has an empty name (hint: --packages ripgrep,jq)", v)
			}
			out = append(out, p)
		}
	}
	return out, nil
}
