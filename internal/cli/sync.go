package cli

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

func syncCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "sync",
		Usage:     "fetch the agent's commits from a VM's workspace into your repository",
		ArgsUsage: "[BRANCH]",
		Description: "Fetches the VM's branch from its workspace into the repository the VM was\n" +
			"created from, as refs/remotes/agent-vm/BRANCH (force-updated: the agent may\n" +
			"rewrite its branch); no tags, nothing else. git runs in your repository; in the\n" +
			"workspace runs only git's upload-pack, with the workspace's hooks, fsmonitor and\n" +
			"filters turned off, so nothing the agent wrote runs on this host. The VM may be\n" +
			"running or stopped. destroy then counts those commits as saved.",
		Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON: branch, ref, old, new, commits, forced, warnings"}},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			res, err := m.Sync(cliCtx.Context, name)
			if err != nil {
				return err
			}
			if cliCtx.Bool("json") {
				return writeJSON(stdio.Out, res)
			}
			printSync(stdio.Out, res)
			for _, w := range res.Warnings {
				fmt.Fprintf(stdio.Err, "agent-vm: warning: %s\n", termsafe.String(w))
			}
			return nil
		}),
	}
}

// printSync says what sync did in one line:
// "refs/remotes/agent-vm/feat: 1a2b3c4d5e6f..5d6e7f8a9b0c (3 new commits)".
func printSync(w io.Writer, r *vm.SyncResult) {
	ref := termsafe.String(r.Ref)
	switch {
	case r.Old == r.New:
		fmt.Fprintf(w, "%s: up to date at %s\n", ref, short(r.New))
	case r.Old == "":
		fmt.Fprintf(w, "%s: new at %s (%s)\n", ref, short(r.New), newCommits(r.Commits))
	case r.Forced:
		fmt.Fprintf(w, "%s: %s...%s (forced: the branch was rewritten; %s)\n", ref, short(r.Old), short(r.New), newCommits(r.Commits))
	default:
		fmt.Fprintf(w, "%s: %s..%s (%s)\n", ref, short(r.Old), short(r.New), newCommits(r.Commits))
	}
}

func newCommits(n int) string {
	if n == 1 {
		return "1 new commit"
	}
	return fmt.Sprintf("%d new commits", n)
}

// short abbreviates a commit's name as git's log does in a large
// repository.
func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}
