package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/template"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/wire"
)

// templateCommand manages the saved machines new VMs start from.
func templateCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "template",
		Usage: "saved machines that new VMs start from in seconds (build, list, rm)",
		Description: "A template is a machine booted once with the guest's generic setup and saved.\n" +
			"A VM's first start begins from the template its machine fits (size, owner, base\n" +
			"image, QEMU, agent-vm) and then receives its own identity and workspace; without\n" +
			"one, or with start --no-template, it boots cold.",
		Subcommands: []*cli.Command{{
			Name: "build",
			Usage: "boot and save the template of the default machine, or of BRANCH's VM's machine, with agent CLIs installed " +
				"(a cold boot and the installs: a few minutes under KVM, 5-10 under TCG)",
			ArgsUsage: "[BRANCH]",
			Description: "Without BRANCH: the machine create and run make with no size flags. With BRANCH:\n" +
				"the machine of that VM (its size, image, owner and network policy).\n" +
				"The template holds the agent CLIs --agents names, at the versions agent-vm pins\n" +
				"(" + template.PinnedAgents() + ") unless NAME@VERSION says otherwise;\n" +
				"a VM started from it with one of them runs it at once, with no install.\n" +
				"Building again replaces the template of that machine; VMs started from the old one\n" +
				"keep working (its disk stays while they use it).",
			Flags: []cli.Flag{
				timeoutFlag(bootTimeout),
				&cli.StringFlag{Name: "agents", Value: "all", Usage: "agent CLIs to install: all (those that run on the Debian guest), none, or a comma-separated list of claude, codex, gemini, each optionally NAME@VERSION (e.g. claude@latest)"},
			},
			BashComplete: vmCompletion(stdio),
			Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
				if cliCtx.NArg() > 1 {
					return cmdline.Usagef("template build takes at most one BRANCH, got %d arguments", cliCtx.NArg())
				}
				if err := template.CheckAgents(cliCtx.String("agents")); err != nil {
					return err
				}
				return buildTemplate(cliCtx, stdio, m, cliCtx.Args().First(), cliCtx.String("agents"), cliCtx.Duration("timeout"))
			}),
		}, {
			Name:  "list",
			Usage: "list the templates",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
			Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
				ts, err := wire.Templates(m).List(cliCtx.Context)
				if err != nil {
					return err
				}
				if cliCtx.Bool("json") {
					if ts == nil {
						ts = []template.Info{}
					}
					return writeJSON(stdio.Out, ts)
				}
				if len(ts) == 0 {
					fmt.Fprintln(stdio.Out, "no templates (`agent-vm template build` makes one of the default machine, with the agent CLIs)")
					return nil
				}
				rows := [][]string{{"TEMPLATE", "BUILT FOR", "BUILT", "AGENTS", "STATE", "VM DISKS ON IT"}}
				var notes []string
				for _, t := range ts {
					st, built := "current", t.Built.Local().Format(time.DateTime)
					switch {
					case !t.Ready:
						st, built = "removed (its disk is kept for the VMs on it)", "-"
					case len(t.Stale) > 0:
						st = "older (below)"
						for _, why := range t.Stale {
							notes = append(notes, t.Slug+": "+why)
						}
					}
					agents := template.AgentsText(t.Agents)
					if agents == "" {
						agents = "-"
					}
					rows = append(rows, []string{t.Slug, t.For, built, agents, st, strconv.Itoa(t.UsedBy)})
				}
				if err := writeTable(stdio.Out, rows); err != nil {
					return err
				}
				for _, n := range notes {
					fmt.Fprintln(stdio.Out, n)
				}
				if len(notes) > 0 {
					fmt.Fprintln(stdio.Out, "`agent-vm template build [BRANCH]` again replaces a template; VMs started from the old one keep working")
				}
				return nil
			}),
		}, {
			Name:      "rm",
			Usage:     "remove a template (its disk stays while VMs' disks are made on it)",
			ArgsUsage: "TEMPLATE|all",
			Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
				if cliCtx.NArg() != 1 {
					return fmt.Errorf("template rm takes one template name, or all (hint: `agent-vm template list` lists them)")
				}
				if err := wire.Templates(m).Remove(cliCtx.Context, cliCtx.Args().First()); err != nil {
					return err
				}
				fmt.Fprintf(stdio.Out, "removed template %s\n", cliCtx.Args().First())
				return nil
			}),
		}},
	}
}

// buildTemplate builds the template of BRANCH's VM's machine (the default
// machine for "") with agents, and says what it made.
func buildTemplate(cliCtx *cli.Context, stdio IO, m *vm.Manager, branch, agents string, timeout time.Duration) error {
	if err := m.Host.Prepare(cliCtx.Context); err != nil {
		return err
	}
	p := newProgress(stdio.Err)
	res, err := wire.Templates(m).Build(cliCtx.Context, branch, agents, template.Boot{Timeout: timeout, Report: p.reporter()})
	p.done()
	if err != nil {
		return err
	}
	machine := "the default machine"
	if branch != "" {
		machine = "VM " + branch + "'s machine"
	}
	with := template.AgentsText(res.Agents)
	if with == "" {
		with = "no agent CLI"
	}
	fmt.Fprintf(stdio.Out, "built template %s in %s: %s, with %s (%s); new VMs of this machine start from it in seconds\n", res.Slug, res.Took.Round(time.Second), machine, with, res.Dir)
	for _, old := range res.Replaced {
		fmt.Fprintf(stdio.Out, "it replaces template %s (whose disk stays while VMs started from it use it)\n", old)
	}
	return nil
}
