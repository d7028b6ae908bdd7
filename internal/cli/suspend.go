package cli

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
)

func suspendCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "suspend",
		Usage: "keep a running VM's memory while it does not run (QEMU: saved to disk, its QEMU ends; vagrant: paused); resume brings it back",
		Description: "The guest's processes and memory are kept. A QEMU VM's /workspace is unmounted\n" +
			"for the suspend and mounted again on resume, so processes using it (a shell or an\n" +
			"agent session in /workspace) make suspend refuse, naming them. A vagrant VM is\n" +
			"paused: its QEMU keeps holding its memory, and /workspace stays mounted.",
		ArgsUsage:    "[BRANCH]",
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			res, err := m.Suspend(cliCtx.Context, name)
			if err != nil {
				return err
			}
			detail := ""
			if res.Detail != "" {
				detail = ": " + res.Detail
			}
			fmt.Fprintf(stdio.Out, "suspended the VM of branch %s in %s%s (agent-vm resume %s brings it back)\n", res.Branch, res.Took.Round(100*time.Millisecond), detail, res.Branch)
			return nil
		}),
	}
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
