package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/fork"
	"github.com/agent-vm/agent-vm/internal/forward"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/wire"
)

func forkCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "fork",
		Usage:     "copy a VM into new branches, each a VM of its own with the workspace and disk as they are now",
		ArgsUsage: "NEW [NEW...]",
		Description: "Each NEW is a new branch that starts at the VM's HEAD with a copy of its workspace as it is\n" +
			"(uncommitted changes, untracked and ignored files) and a copy of its root disk (what was\n" +
			"installed in the guest), a VM of its own with its own SSH keys, ports and MCP token. The\n" +
			"VM's size, agent, packages and network policy come along; secrets set for it alone\n" +
			"(secret set --vm) do not. A running VM is paused for the copy and runs on afterwards.\n" +
			"The forks are made stopped: their first start boots the copied disk afresh, so the VM's\n" +
			"processes (agent sessions, servers) are not carried over. agent-vm sync NEW brings a\n" +
			"fork's commits home; destroying either leaves the other whole. The qemu backend's VMs of\n" +
			"this machine can be forked.",
		Flags: []cli.Flag{vmFlag(),
			&cli.BoolFlag{Name: "json", Usage: "print JSON: source, state, paused_ms, unsynced, forks [{branch, slug, ports, commit, files, bytes, skipped, disk_bytes, forwards}]"}},
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if cliCtx.NArg() == 0 {
				return cmdline.Usagef("fork takes at least one NEW branch name (hint: agent-vm fork --vm main try-a try-b)")
			}
			src, news, err := vmAndArgs(cliCtx, stdio, m, nil)
			if err != nil {
				return err
			}
			res, err := wire.Forks(m).Fork(cliCtx.Context, src, news)
			if err != nil {
				return err
			}
			for i, f := range res.Forks { // the source's forwards, on host ports of each fork's own
				var errs []error
				res.Forks[i].Forwards, errs = forward.Copy(cliCtx.Context, m, f.Slug, res.Forwards, e.log)
				for _, err := range errs {
					fmt.Fprintf(stdio.Err, "agent-vm: warning: %s: %v\n", f.Slug, err)
				}
			}
			if cliCtx.Bool("json") {
				return writeJSON(stdio.Out, forkJSON(res))
			}
			printFork(stdio.Out, res)
			return nil
		}),
	}
}

// printFork says what fork made, a line a fork (ports: its forwards,
// guest->host), and what to do next.
func printFork(w io.Writer, r *fork.Result) {
	how := "stopped"
	switch {
	case r.Paused > 0:
		how = fmt.Sprintf("running; paused %.1f s for the copy", r.Paused.Seconds())
	case r.State != "stopped":
		how = r.State
	}
	fmt.Fprintf(w, "forked %s (%s) into:\n", termsafe.String(r.Source), how)
	for _, f := range r.Forks {
		disk := "its disk is made at its first start"
		if f.DiskBytes > 0 {
			disk = "disk " + humanBytes(f.DiskBytes)
		}
		fmt.Fprintf(w, "  %s  branch %s at %s  ssh %d  mcp %d  workspace %d files (%s)  %s\n",
			f.Slug, termsafe.String(f.Branch), short(f.Commit), f.Ports.SSH, f.Ports.MCP, f.Files, humanBytes(f.Bytes), disk)
		if len(f.Forwards) > 0 {
			var s []string
			for _, x := range f.Forwards {
				s = append(s, fmt.Sprintf("%d->%d", x.Guest, x.Host))
			}
			fmt.Fprintf(w, "    forwards (guest->host, as the source's, on ports of its own): %s\n", strings.Join(s, " "))
		}
		if len(f.Skipped) > 0 {
			fmt.Fprintf(w, "    not copied (sockets, FIFOs, devices): %s\n", termsafe.String(strings.Join(f.Skipped, ", ")))
		}
	}
	if r.Unsynced != "" {
		fmt.Fprintf(w, "warning: the guest's last writes may be missing from the copies: %s\n", termsafe.String(r.Unsynced))
	}
	fmt.Fprintf(w, "next: agent-vm start %s (or agent-vm run %s): a fork's first start boots its copy of the disk afresh\n", r.Forks[0].Slug, r.Forks[0].Slug)
}

// forkJSONResult is fork --json's output.
type forkJSONResult struct {
	Source   string      `json:"source"`
	State    string      `json:"state"`
	PausedMS int64       `json:"paused_ms"`
	Unsynced string      `json:"unsynced,omitempty"`
	Forks    []fork.Made `json:"forks"`
}

func forkJSON(r *fork.Result) forkJSONResult {
	return forkJSONResult{Source: r.Source, State: r.State, PausedMS: r.Paused.Milliseconds(), Unsynced: r.Unsynced, Forks: r.Forks}
}
