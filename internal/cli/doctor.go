package cli

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/vm"
)

func doctorCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check what this host can do: QEMU, virtiofsd, KVM, the base image, nix; and the browser a VM would reach",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			r := m.Host.Doctor(cliCtx.Context)
			if cliCtx.Bool("json") {
				return writeJSON(stdio.Out, r)
			}
			printDoctor(stdio, r)
			return nil
		}),
	}
}

// printDoctor prints doctor's table and its verdict, then the browser's
// section.
func printDoctor(stdio IO, r hostsetup.DoctorReport) {
	printChecks(stdio, r.Checks)
	if len(r.Pins) > 0 {
		fmt.Fprintf(stdio.Out, "\npins (%s, by `agent-vm setup`): every VM's egress proxy connects to each address for its names alone\n", r.PinsFile)
		for _, l := range egress.PinLines(r.Pins) {
			fmt.Fprintf(stdio.Out, "    %s\n", l)
		}
	}
	printVerdict(stdio, r)
	if r.Browser.Chrome != "" {
		fmt.Fprintf(stdio.Out, "\nbrowser (run --chrome, agent-vm browser)\n")
		printChecks(stdio, r.Browser.Checks)
		fmt.Fprintf(stdio.Out, "run --chrome would use: %s\n", r.Browser.Chrome)
	}
}

func printChecks(stdio IO, checks []hostsetup.Check) {
	for _, c := range checks {
		mark := "ok  "
		if !c.OK {
			mark = "--  "
		}
		fmt.Fprintf(stdio.Out, "%s%-26s %s\n", mark, c.Name, c.Detail)
		if c.Hint != "" {
			fmt.Fprintf(stdio.Out, "    %-26s hint: %s\n", "", c.Hint)
		}
	}
}

// printVerdict says whether, and with which backends, this host runs VMs.
func printVerdict(stdio IO, r hostsetup.DoctorReport) {
	var others []string
	for _, b := range r.Backends {
		if b != r.Backend {
			others = append(others, "--backend "+b)
		}
	}
	switch {
	case r.VMReady && len(others) > 0:
		fmt.Fprintf(stdio.Out, "\nthis host can run VMs (%s) with the %s backend, and with %s\n", r.Accel, r.Backend, strings.Join(others, " or "))
	case r.VMReady:
		fmt.Fprintf(stdio.Out, "\nthis host can run VMs (%s) with the %s backend\n", r.Accel, r.Backend)
	case len(others) > 0:
		fmt.Fprintf(stdio.Out, "\nthis host cannot run VMs with the %s backend yet (see the hints above), but can with %s\n", r.Backend, strings.Join(others, " or "))
	default:
		fmt.Fprintf(stdio.Out, "\nthis host cannot run VMs yet: see the hints above\n")
	}
}
