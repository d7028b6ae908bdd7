package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/template"
	"github.com/agent-vm/agent-vm/internal/vm"
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
			Name:         "build",
			Usage:        "boot and save the template a VM's machine fits (a cold boot, about a minute under KVM, several under TCG)",
			ArgsUsage:    "[BRANCH]",
			Flags:        []cli.Flag{timeoutFlag(bootTimeout)},
			BashComplete: vmCompletion(stdio),
			Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
				name, err := vmName(cliCtx, m)
				if err != nil {
					return err
				}
				if err := m.PrepareHost(cliCtx.Context); err != nil {
					return err
				}
				p := newProgress(stdio.Err)
				res, err := m.BuildTemplate(cliCtx.Context, name, vm.StartOptions{Timeout: cliCtx.Duration("timeout"), Report: p.reporter()})
				p.done()
				if err != nil {
					return err
				}
				fmt.Fprintf(stdio.Out, "built template %s in %s (%s); new VMs of this machine start from it\n", res.Slug, res.Took.Round(time.Second), res.Dir)
				return nil
			}),
		}, {
			Name:  "list",
			Usage: "list the templates",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
			Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
				ts, err := m.Templates()
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
					fmt.Fprintln(stdio.Out, "no templates (agent-vm template build BRANCH makes one)")
					return nil
				}
				rows := [][]string{{"TEMPLATE", "BUILT FOR", "BUILT", "STATE", "VM DISKS ON IT"}}
				for _, t := range ts {
					st, built := "ready", t.Built.Local().Format(time.DateTime)
					if !t.Ready {
						st, built = "removed (its disk is kept for the VMs on it)", "-"
					}
					rows = append(rows, []string{t.Slug, t.For, built, st, strconv.Itoa(t.UsedBy)})
				}
				return writeTable(stdio.Out, rows)
			}),
		}, {
			Name:      "rm",
			Usage:     "remove a template (its disk stays while VMs' disks are made on it)",
			ArgsUsage: "TEMPLATE|all",
			Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
				if cliCtx.NArg() != 1 {
					return fmt.Errorf("template rm takes one template name, or all (hint: `agent-vm template list` lists them)")
				}
				if err := m.RemoveTemplate(cliCtx.Context, cliCtx.Args().First()); err != nil {
					return err
				}
				fmt.Fprintf(stdio.Out, "removed template %s\n", cliCtx.Args().First())
				return nil
			}),
		}},
	}
}
