package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/size"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

func suspendCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "suspend",
		Usage: "keep a running VM's memory while it does not run: saved to disk (its QEMU ends), or paused in place when the workspace is in use; resume brings it back",
		Description: "The guest's processes and memory are kept. A QEMU VM is saved to disk and its\n" +
			"QEMU ends, so it costs no CPU or RAM; its /workspace is unmounted for that and\n" +
			"mounted again on resume. While processes use /workspace (an agent session, a\n" +
			"shell there), the VM is paused in place instead: its CPUs stop, its QEMU keeps\n" +
			"holding its memory (host RAM) and the workspace stays mounted, so they go on at\n" +
			"resume. suspend says which it did. A vagrant VM is always paused. --hibernate\n" +
			"pauses it with its memory moved to disk; using the VM wakes it (docs/usage.md).",
		ArgsUsage: "[BRANCH]",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "save", Usage: "save to disk or refuse: refuses while processes use /workspace, naming them"},
			&cli.BoolFlag{Name: "pause", Usage: "pause in place even when the VM could be saved to disk"},
			&cli.BoolFlag{Name: "hibernate", Usage: "pause in place with the memory moved to disk; using the VM wakes it"},
		},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			res, err := m.Suspend(cliCtx.Context, name, vm.SuspendOptions{Save: cliCtx.Bool("save"), Pause: cliCtx.Bool("pause"), Hibernate: cliCtx.Bool("hibernate")})
			if err != nil {
				return err
			}
			fmt.Fprint(stdio.Out, suspendMessage(res))
			return nil
		}),
	}
}

// suspendMessage says what suspend did: saved to disk, hibernated (whose
// detail says how it wakes), or paused in place and why, with its host RAM.
func suspendMessage(res *vm.SuspendResult) string {
	took := res.Took.Round(100 * time.Millisecond)
	if !res.Paused || res.Suspend == vminfo.SuspendHibernated {
		msg := strings.TrimSuffix(fmt.Sprintf("suspended the VM of branch %s in %s: %s", res.Branch, took, res.Detail), ": ")
		if res.Suspend != vminfo.SuspendHibernated {
			msg += " (agent-vm resume " + res.Branch + " brings it back)"
		}
		return msg + "\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "paused the VM of branch %s in place in %s", res.Branch, took)
	switch {
	case res.Busy != "":
		fmt.Fprintf(&b, ": the workspace is in use by\n%s\n", termsafe.Indent(res.Busy))
	case res.CannotSave != "":
		fmt.Fprintf(&b, ", as it cannot be saved to disk: %s\n", res.CannotSave)
	default:
		b.WriteString("\n")
	}
	ram := ""
	if res.HostRAM > 0 {
		ram = fmt.Sprintf(" (%s of host RAM)", size.Human(int(res.HostRAM>>20)))
	}
	fmt.Fprintf(&b, "No guest code runs; the VM's memory stays in its QEMU%s, and the workspace stays mounted. `agent-vm resume %s` continues it; `agent-vm stop %s` shuts it down.\n", ram, res.Branch, res.Branch)
	return b.String()
}

// stoppedSuspended says what stop did to a suspended VM.
func stoppedSuspended(res *vm.StopResult) string {
	if res.Suspend == vminfo.SuspendPaused || res.Suspend == vminfo.SuspendHibernated {
		return fmt.Sprintf("VM of branch %s was paused in place: shut it down (the processes it held are gone; the next start boots it afresh)", res.Branch)
	}
	return fmt.Sprintf("VM of branch %s was suspended: discarded its saved state (the processes it held are gone; its disk is as the guest left it at suspend, and the next start boots it afresh)", res.Branch)
}

func resumeCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:         "resume",
		Usage:        "resume a suspended VM (start does too)",
		ArgsUsage:    "[BRANCH]",
		Flags:        []cli.Flag{timeoutFlag("2m")},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			p := newProgress(stdio.Err)
			res, err := m.Resume(cliCtx.Context, name, vm.StartOptions{Timeout: cliCtx.Duration("timeout"), Report: p.reporter()})
			p.done()
			if err != nil {
				return err
			}
			printStarted(stdio, res)
			return nil
		}),
	}
}
