package cli

import (
	"bufio"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/template"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/wire"
)

func setupCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "setup",
		Usage: "install what this host needs (packages, the base image), pin the package sources, probe KVM and show what the host can do",
		Description: "First it resolves the package sources VMs use (Debian's mirrors, npm's registry, the agents'\n" +
			"hosts) as their egress proxies will. A name this host's resolver answers with an address the proxies\n" +
			"refuse as not globally reachable (a gateway, a corporate mirror, split DNS) is pinned: every VM's\n" +
			"proxy then connects to that address for that name alone. Never one of this host's own addresses.\n" +
			"The pins are recorded without asking, in the configuration directory's pins.json; --no-pins only\n" +
			"says what it found. Then it installs the missing host packages with apt-get or dnf (as root;\n" +
			"otherwise it prints the sudo command), builds the Debian base image, probes KVM, and ends with the\n" +
			"doctor table. It asks once before it installs or builds anything; without a terminal it needs --yes.\n" +
			"On NixOS it installs nothing and points to the flake. Running it again changes nothing, but the pins\n" +
			"of names that now resolve otherwise.",
		Flags: []cli.Flag{
			// setup boots a VM only for --template.
			boundedTimeoutFlag("with --template: how long the template's boot waits for SSH and agent-mcp to answer", bootTimeout),
			&cli.BoolFlag{Name: "yes", Aliases: []string{"y"}, Usage: "do it without asking"},
			&cli.BoolFlag{Name: "tests", Usage: "also what the test suite needs (nix, sshd, xorriso, shellcheck, ...)"},
			&cli.StringFlag{Name: "backend", Value: "auto", Usage: "also install what this backend needs (vagrant: vagrant, vagrant-libvirt and libvirt)"},
			&cli.BoolFlag{Name: "check", Usage: "change nothing: list each program, where it is or which package has it; exit 1 if any is missing"},
			&cli.BoolFlag{Name: "template", Usage: "also build the default machine's template with the agent CLIs (as template build does), so that every new branch's VM starts in seconds with its agent installed"},
			&cli.StringFlag{Name: "agents", Value: "all", Usage: "with --template: the agent CLIs it holds (all, none, or e.g. claude,codex@0.171.0)"},
			&cli.BoolFlag{Name: "no-pins", Usage: "record no pins, and keep those recorded before: only say which package sources resolve here to addresses the egress proxies refuse"},
		},
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			tests := cliCtx.Bool("tests")
			if cliCtx.IsSet("agents") && !cliCtx.Bool("template") {
				return cmdline.Usagef("--agents says what the template holds; it goes with --template (hint: agent-vm setup --template --agents %s)", cliCtx.String("agents"))
			}
			if err := template.CheckAgents(cliCtx.String("agents")); err != nil {
				return err
			}
			if cliCtx.Bool("check") {
				return checkPrograms(stdio, m, tests, cliCtx.String("backend"))
			}
			if err := pinSources(cliCtx, stdio, m); err != nil {
				return err
			}
			consent := askConsent(stdio)
			if cliCtx.Bool("yes") {
				consent = func([]string) (bool, error) { return true, nil }
			}
			rep, err := m.Host.Setup(cliCtx.Context, tests, cliCtx.String("backend"), consent)
			if len(rep.Installed) > 0 {
				fmt.Fprintf(stdio.Out, "installed: %s\n", strings.Join(rep.Installed, " "))
			}
			if rep.Image != "" {
				fmt.Fprintf(stdio.Out, "built the base image: %s\n", rep.Image)
			}
			for _, c := range rep.Changed {
				fmt.Fprintf(stdio.Out, "changed: %s\n", c)
			}
			for _, n := range rep.Notes {
				fmt.Fprintf(stdio.Out, "note: %s\n", n)
			}
			if err != nil {
				return err
			}
			if len(rep.Installed) == 0 && rep.Image == "" && len(rep.Changed) == 0 {
				fmt.Fprintln(stdio.Out, "nothing to install: this host has what agent-vm needs")
			}
			if cliCtx.Bool("template") {
				if slug := wire.Templates(m).Current(cliCtx.Context, cliCtx.String("agents")); slug != "" {
					fmt.Fprintf(stdio.Out, "the default machine's template %s is current (`agent-vm template list`)\n", slug)
				} else if err := buildTemplate(cliCtx, stdio, m, "", cliCtx.String("agents"), cliCtx.Duration("timeout")); err != nil {
					return err
				}
			}
			fmt.Fprintln(stdio.Out)
			printDoctor(stdio, m.Host.Doctor(cliCtx.Context))
			return nil
		}),
	}
}

// askConsent asks on the terminal; without one there is no consent to ask.
func askConsent(stdio IO) func([]string) (bool, error) {
	if stdio.In == nil || !term.IsTerminal(int(stdio.In.Fd())) {
		return nil
	}
	return func(actions []string) (bool, error) {
		fmt.Fprintf(stdio.Err, "agent-vm setup will:\n")
		for _, a := range actions {
			fmt.Fprintf(stdio.Err, "  - %s\n", a)
		}
		fmt.Fprintf(stdio.Err, "Go on? [y/N] ")
		line, err := bufio.NewReader(stdio.In).ReadString('\n')
		if err != nil && line == "" {
			return false, fmt.Errorf("reading the answer: %w", err)
		}
		a := strings.ToLower(strings.TrimSpace(line))
		return a == "y" || a == "yes", nil
	}
}

// checkPrograms prints each program agent-vm (and with tests, the test
// suite) runs and fails when any is missing (CI's check that the installer
// installs what the tests run).
func checkPrograms(stdio IO, m *vm.Manager, tests bool, backend string) error {
	checks, err := m.Host.CheckPrograms(tests, backend)
	for _, c := range checks {
		if c.Path != "" {
			fmt.Fprintf(stdio.Out, "ok  %-20s %s\n", c.Name, c.Path)
		} else {
			fmt.Fprintf(stdio.Out, "--  %-20s missing (%s)\n", c.Name, c.Hint)
		}
	}
	return err
}
