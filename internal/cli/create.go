package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/size"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

func createCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "create",
		Usage:     "create a VM record and workspace for a branch",
		ArgsUsage: "[BRANCH]",
		Description: "Clones the repository you are in into the VM's workspace at BRANCH (default: the\n" +
			"current branch; a new branch starts at --from, default HEAD), makes the VM's SSH keys and\n" +
			"MCP token, and picks its ports. Nothing runs until agent-vm start.\n\n" +
			"The repository may hold .agent-vm/config.toml (TOML: packages = [\"ripgrep\"], and defaults\n" +
			"for cpus = 2, memory = \"4G\", agent = \"claude\"; the flags win) and .agent-vm/provision.sh,\n" +
			"which the guest runs once as root at its first boot, from the workspace as it is then\n" +
			"(output: agent-vm logs; a failure fails that start). agent-vm reset provisions afresh.",
		Flags: append([]cli.Flag{
			// Deprecated: BRANCH is how every verb names the VM.
			&cli.StringFlag{Name: "branch", Aliases: []string{"b"}, Usage: "the branch, as BRANCH is (deprecated)", Hidden: true},
			&cli.StringFlag{Name: "agent", Usage: "install agent CLI `NAME` in the VM at its first boot and make it the agent run runs: claude, codex or gemini (qemu and vagrant backends)"},
		}, createFlags()...),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			o, err := createOptions(cliCtx)
			if err != nil {
				return err
			}
			if o.Branch, err = createBranch(cliCtx, stdio); err != nil {
				return err
			}
			r, err := m.Create(cliCtx.Context, o)
			if err != nil {
				return err
			}
			l := m.Root.Layout(r.Slug)
			out := stdio.Out
			fmt.Fprintf(out, "created VM %s for branch %s\n", r.Slug, r.Branch)
			if r.Guest.Foreign != "" {
				fmt.Fprintf(out, "  backend:   %s (size as its Vagrantfile says)\n", r.Backend)
			} else {
				fmt.Fprintf(out, "  backend:   %s (%d CPUs, %s, %d GiB disk)\n", r.Backend, r.Resources.CPUs, size.Human(r.Resources.MemoryMiB), r.Resources.DiskGiB)
			}
			if ws, host := m.WorkspacePath(r, l); host != "" {
				fmt.Fprintf(out, "  workspace: %s on host %s\n", ws, host)
			} else {
				fmt.Fprintf(out, "  workspace: %s\n", ws)
			}
			if f, ok := m.Foreign(r); ok {
				printForeign(out, f.Config, f.Lacks, f.Own)
			} else {
				fmt.Fprintf(out, "  ports:     ssh 127.0.0.1:%d, mcp 127.0.0.1:%d\n", r.Ports.SSH, r.Ports.MCP)
			}
			fmt.Fprintf(out, "next: agent-vm start %s\n", r.Slug)
			return nil
		}),
	}
}

// createBranch is create's branch: its BRANCH argument, or the deprecated
// --branch (the same); neither is "", which vm.Create takes as the current
// branch.
func createBranch(cliCtx *cli.Context, stdio IO) (string, error) {
	flag := cliCtx.String("branch")
	if cliCtx.IsSet("branch") {
		fmt.Fprintf(stdio.Err, "agent-vm: --branch is deprecated; write %s %s\n", commandPath(cliCtx), flag)
	}
	switch cliCtx.NArg() {
	case 0:
		return flag, nil
	case 1:
		arg := cliCtx.Args().First()
		switch {
		case arg == "":
			return "", cmdline.Usagef("create: BRANCH is empty (hint: leave it out for the current branch)")
		case cliCtx.IsSet("branch") && arg != flag:
			return "", cmdline.Usagef("create got BRANCH %q and --branch %q (hint: give the branch once, as BRANCH)", arg, flag)
		}
		return arg, nil
	default:
		return "", cmdline.Usagef("create takes at most one BRANCH, got %d arguments (hint: agent-vm create BRANCH [flags])", cliCtx.NArg())
	}
}

// createFlags are create's flags that run shares (run makes the VM when the
// branch has none).
func createFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "from", Usage: "start point when the branch does not exist yet (default: HEAD)"},
		&cli.StringFlag{Name: "repo", Usage: "the repository to clone (default: the one you are in)"},
		&cli.StringFlag{Name: "backend", Value: "auto", Usage: "the backend that runs the VM: auto, qemu, nixos, vagrant or libvirt"},
		&cli.StringFlag{Name: "host", Usage: "place the VM on the registered libvirt host `NAME` (see host list: this machine's libvirtd, or another machine linked with host link), with the libvirt backend"},
		&cli.IntFlag{Name: "port", Usage: "host port for agent-mcp", DefaultText: "the first free from 8000"},
		&cli.IntFlag{Name: "ssh-port", Usage: "host port for the guest's SSH", DefaultText: "the first free from 2222"},
		&cli.IntFlag{Name: "cpus", Usage: "virtual CPUs, at most the host's CPU threads", DefaultText: "4"},
		&cli.StringFlag{Name: "memory", Usage: sizeUsage("memory", "4G, 1.5G or 2048M", "MiB"), DefaultText: "4G"},
		&cli.StringFlag{Name: "disk", Usage: sizeUsage("disk size", "20G or 1.5T, in whole GiB", "GiB"), DefaultText: "20G"},
		&cli.StringFlag{Name: "net", Value: "allow", Usage: "egress mode: allow (the allow-list: agent APIs, package registries, the repository's git host), open (any destination) or offline (none); always through agent-vm's proxy, logged, with the host unreachable (agent-vm net changes it later)"},
		&cli.BoolFlag{Name: "no-host-ca", Usage: "do not make the guest trust the CA certificates this host added (by default it does, so HTTPS through a TLS-inspecting proxy works in the guest)"},
		&cli.BoolFlag{Name: "ignore-repo-policy", Usage: "do not read the repository's network policy, .agent-vm/policy.toml (by default its allow, deny and request rules join the VM's, read from the commit the VM starts at)"},
		&cli.BoolFlag{Name: "overcommit", Usage: "allow more --memory than this host's RAM or more --cpus than its CPU threads"},
		&cli.StringFlag{Name: "config", Usage: "an extra NixOS module for the VM (nixos backend)"},
		&cli.StringFlag{Name: "nixpkgs", Usage: "the nixpkgs to build the VM from, a PATH or FLAKEREF (nixos backend; default: the nixpkgs agent-vm was built with, else NIX_PATH)"},
		&cli.StringSliceFlag{Name: "packages", Usage: "packages to install in the guest at its first boot, besides those of the repository's .agent-vm/config.toml: Debian names (qemu) or nixpkgs attribute names (nixos); comma-separated and repeatable, e.g. --packages ripgrep,jq"},
		&cli.StringSliceFlag{Name: "allow-origin", Usage: "a browser origin agent-mcp accepts, e.g. https://claude.ai (repeatable)"},
		&cli.StringFlag{Name: "image", Usage: "base disk image, qcow2 or raw (qemu backend; default: the image agent-vm image build makes)"},
		&cli.StringFlag{Name: "box", Usage: "a Vagrant box, e.g. debian/bookworm64 (vagrant backend; default: agent-vm's own box)"},
		&cli.StringFlag{Name: "vagrantfile", Value: "auto", Usage: "vagrant backend: auto runs the repository's own Vagrantfile as is when it has one at its root (without agent-mcp, the pinned host key, port choice, the /workspace share or network containment), else agent-vm's; repo insists on the repository's; generate always uses agent-vm's own"},
		workspaceCacheFlag("saved in the VM's record (start --workspace-cache changes it)"),
	}
}

func createOptions(cliCtx *cli.Context) (vm.CreateOptions, error) {
	o := vm.CreateOptions{
		Repo: cliCtx.String("repo"), From: cliCtx.String("from"),
		Backend: cliCtx.String("backend"), Host: cliCtx.String("host"), MCPPort: cliCtx.Int("port"), SSHPort: cliCtx.Int("ssh-port"), CPUs: cliCtx.Int("cpus"),
		Config: cliCtx.String("config"), Image: cliCtx.String("image"), Box: cliCtx.String("box"), Vagrantfile: cliCtx.String("vagrantfile"), Nixpkgs: cliCtx.String("nixpkgs"),
		AllowOrigins: cliCtx.StringSlice("allow-origin"), Overcommit: cliCtx.Bool("overcommit"),
		NoHostCA: cliCtx.Bool("no-host-ca"), IgnoreRepoPolicy: cliCtx.Bool("ignore-repo-policy"), Agent: cliCtx.String("agent"), Net: cliCtx.String("net"),
		WorkspaceCache: cliCtx.String("workspace-cache"),
	}
	switch o.Backend {
	case vm.BackendAuto, vm.BackendQEMU, vm.BackendNixOS, vm.BackendVagrant, vm.BackendLibvirt:
	default:
		return o, cmdline.Usagef("--backend %q: must be auto, qemu, nixos, vagrant or libvirt", o.Backend)
	}
	if cliCtx.IsSet("port") && (o.MCPPort < 1024 || o.MCPPort > 65535) {
		return o, cmdline.Usagef("--port %d: must be between 1024 and 65535", o.MCPPort)
	}
	if cliCtx.IsSet("ssh-port") && (o.SSHPort < 1024 || o.SSHPort > 65535) {
		return o, cmdline.Usagef("--ssh-port %d: must be between 1024 and 65535", o.SSHPort)
	}
	if o.SSHPort != 0 && o.SSHPort == o.MCPPort {
		return o, cmdline.Usagef("--ssh-port and --port are both %d: the VM needs two ports", o.SSHPort)
	}
	if cliCtx.IsSet("cpus") && o.CPUs < 1 {
		return o, cmdline.Usagef("--cpus %d: must be at least 1", o.CPUs)
	}
	var err error
	if o.Packages, err = packagesFlag(cliCtx); err != nil {
		return o, err
	}
	if s := cliCtx.String("memory"); s != "" {
		if o.MemoryMiB, err = parseSize("memory", s, "M"); err != nil {
			return o, err
		}
	}
	if s := cliCtx.String("disk"); s != "" {
		mib, err := parseSize("disk", s, "G")
		if err != nil {
			return o, err
		}
		if mib%1024 != 0 {
			return o, cmdline.Usagef("--disk %q is not a whole number of GiB (hint: disks are sized in GiB, e.g. --disk %dG)", s, (mib+1023)/1024)
		}
		o.DiskGiB = mib / 1024 // at least 1: parseSize refuses 0; vm.Create checks the range
	}
	if o.Repo == "" {
		if o.Repo, err = os.Getwd(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// sizeUsage is the usage of a size flag (--memory, --disk): one grammar,
// internal/size's, whose unit for a bare number each flag's help names.
func sizeUsage(what, examples, bareUnit string) string {
	return what + ": a `SIZE` such as " + examples + " (K, M, G or T; a bare number is in " + bareUnit + ")"
}

// parseSize reads --memory or --disk (internal/size's grammar, the one
// config.toml's memory uses too) into MiB; a bare number is in defaultUnit.
func parseSize(flag, s, defaultUnit string) (int, error) {
	mib, err := size.ParseMiB(s, defaultUnit)
	if err != nil {
		return 0, cmdline.Usagef("--%s %q is %v (hint: e.g. --%s 4G or 4096M)", flag, s, err, flag)
	}
	return mib, nil
}

// printForeign tells the user, at create, what running the user's own
// configuration as is costs and how to get it back.
func printForeign(out io.Writer, config string, lacks []string, own string) {
	fmt.Fprintf(out, "  runs as is: %s, the repository's own, never changed\n", termsafe.String(config))
	fmt.Fprintf(out, "  agent-vm cannot give this VM:\n")
	for _, l := range lacks {
		fmt.Fprintf(out, "    - %s\n", l)
	}
	fmt.Fprintf(out, "  for all of them: %s\n", own)
}
