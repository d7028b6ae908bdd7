package gitws

import (
	"fmt"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// maxListed bounds each list in a report; the rest is counted.
const maxListed = 15

// Report says, for a person, what would be lost with the workspace and how
// to keep it. vm is how the user names the VM on the command line.
func (u *Unsaved) Report(ws, branch, vm string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "the workspace of %q has work that exists nowhere else:\n", branch)
	section(&b, u.Changed, "uncommitted change", "uncommitted changes")
	section(&b, u.Untracked, "untracked file", "untracked files")
	section(&b, u.Stashes, "stash", "stashes")
	var commits []string
	for _, c := range u.Unpushed {
		commits = append(commits, fmt.Sprintf("%s %s (%s)", c.Hash, c.Subject, c.Branch))
	}
	section(&b, commits, "commit that no remote has", "commits that no remote has")
	q := execx.ShellQuote
	git := "git -C " + q(ws)
	if u.ForeignOwner {
		// The workspace belongs to the guest's uid: git refuses it as
		// "dubious ownership" unless told otherwise.
		git = "git -c safe.directory=" + q(ws) + " -C " + q(ws)
	}
	b.WriteString("to keep it:\n")
	if len(u.Changed) > 0 || len(u.Untracked) > 0 {
		fmt.Fprintf(&b, "  %s add -A && %s commit -m 'work from the agent VM'\n", git, git)
	}
	if len(u.Stashes) > 0 {
		fmt.Fprintf(&b, "  %s stash pop   (or `stash branch NAME` for each stash)\n", git)
	}
	for _, c := range u.Unpushed {
		if c.Branch == "HEAD" {
			fmt.Fprintf(&b, "  %s branch saved-work HEAD   (the commits on the detached HEAD; then push that branch)\n", git)
			break
		}
	}
	for _, br := range u.branchesToPush(len(u.Changed) > 0 || len(u.Untracked) > 0, branch) {
		fmt.Fprintf(&b, "  %s push origin %s\n", git, q(br))
	}
	if len(u.Risky) > 0 {
		b.WriteString("careful: the agent can change the workspace's .git, and these settings make git on this host run commands:\n")
		for _, r := range u.Risky {
			fmt.Fprintf(&b, "    %s\n", r)
		}
		fmt.Fprintf(&b, "  review them (`%s config --local --list`, .git/hooks) before running git there, or fetch from your repository instead of pushing from the workspace\n", git)
	}
	fmt.Fprintf(&b, "or destroy it anyway, losing all of the above: agent-vm destroy %s --force", q(vm))
	return b.String()
}

// branchesToPush lists the branches with unpushed commits, plus the VM's
// branch when new commits are about to be made on it.
func (u *Unsaved) branchesToPush(committing bool, branch string) []string {
	var out []string
	seen := map[string]bool{}
	if committing {
		out, seen[branch] = append(out, branch), true
	}
	for _, c := range u.Unpushed {
		if c.Branch != "HEAD" && !seen[c.Branch] {
			seen[c.Branch] = true
			out = append(out, c.Branch)
		}
	}
	return out
}

func section(b *strings.Builder, items []string, one, many string) {
	if len(items) == 0 {
		return
	}
	noun := many
	if len(items) == 1 {
		noun = one
	}
	fmt.Fprintf(b, "  %d %s:\n", len(items), noun)
	for i, it := range items {
		if i == maxListed {
			fmt.Fprintf(b, "    ... and %d more\n", len(items)-maxListed)
			break
		}
		fmt.Fprintf(b, "    %s\n", it)
	}
}
