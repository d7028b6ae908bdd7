package gitws

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// maxListed bounds each list in a report; the rest is counted.
const maxListed = 15

// Report says, for a person, what would be lost with the workspace and how
// to keep it. vm is how the user names the VM on the command line. Every
// string taken from the workspace (paths, subjects, ref names, settings) is
// escaped with termsafe: the agent wrote them.
func (u *Unsaved) Report(ws, branch, vm string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "the workspace of %q has work that exists nowhere else:\n", branch)
	u.sections(&b, "  ")
	git := func(dir string) string {
		q := termsafe.String(execx.ShellQuote(dir))
		if u.ForeignOwner {
			// The workspace belongs to the guest's uid: git refuses it as
			// "dubious ownership" unless told otherwise.
			return "git -c safe.directory=" + q + " -C " + q
		}
		return "git -C " + q
	}
	b.WriteString("to keep it:\n")
	u.keep(&b, git, ws, branch)
	sync := "agent-vm sync " + execx.ShellQuote(vm)
	if u.onBranch(branch) {
		fmt.Fprintf(&b, "  %s   (instead of that push: fetches %s into your repository as %s, running nothing of the workspace's)\n",
			sync, termsafe.String(branch), termsafe.String(SyncRefs+branch))
	}
	if risky := u.allRisky(""); len(risky) > 0 {
		b.WriteString("careful: the agent can change the workspace's .git, and these settings make git on this host run commands:\n")
		for _, r := range risky {
			fmt.Fprintf(&b, "    %s\n", termsafe.String(r))
		}
		fmt.Fprintf(&b, "  review them (`%s config --local --list`, .git/hooks) before running git there, or use `%s`, which runs none of them, instead of pushing from the workspace\n", git(ws), sync)
	}
	fmt.Fprintf(&b, "or destroy it anyway, losing all of the above: agent-vm destroy %s --force", execx.ShellQuote(vm))
	return b.String()
}

// sections lists the work of u and of its submodules, nested.
func (u *Unsaved) sections(b *strings.Builder, indent string) {
	section(b, indent, u.Changed, "uncommitted change", "uncommitted changes")
	section(b, indent, u.Untracked, "untracked file", "untracked files")
	section(b, indent, u.Stashes, "stash", "stashes")
	var commits []string
	for _, c := range u.Unpushed {
		commits = append(commits, fmt.Sprintf("%s %s (%s)", c.Hash, c.Subject, refLabel(c.Ref)))
	}
	section(b, indent, commits, "commit that no remote has", "commits that no remote has")
	section(b, indent, u.Ignored, "ignored file that exists only here", "ignored files that exist only here")
	for _, s := range u.Submodules {
		if !s.Empty() {
			fmt.Fprintf(b, "%sin submodule %s:\n", indent, termsafe.String(s.Path))
			s.sections(b, indent+"  ")
		}
	}
}

// keep writes the commands that keep u's work, submodules first: their new
// commits are what the workspace's own commit then records.
func (u *Unsaved) keep(b *strings.Builder, git func(dir string) string, dir, branch string) {
	for _, s := range u.Submodules {
		s.keep(b, git, filepath.Join(dir, s.Path), "")
	}
	g := git(dir)
	committing := len(u.Changed) > 0 || len(u.Untracked) > 0
	if committing {
		fmt.Fprintf(b, "  %s add -A && %s commit -m 'work from the agent VM'\n", g, g)
	}
	if len(u.Stashes) > 0 {
		fmt.Fprintf(b, "  %s stash pop   (or `stash branch NAME` for each stash)\n", g)
	}
	for _, c := range u.Unpushed {
		if c.Ref == "HEAD" {
			fmt.Fprintf(b, "  %s branch saved-work HEAD   (the commits on the detached HEAD; then push that branch)\n", g)
			break
		}
	}
	for _, ref := range u.refsToPush(committing, branch) {
		fmt.Fprintf(b, "  %s push origin %s\n", g, termsafe.String(execx.ShellQuote(ref)))
	}
	if len(u.Ignored) > 0 {
		fmt.Fprintf(b, "  copy the ignored files you need out of %s (git add leaves them out)\n", termsafe.String(execx.ShellQuote(dir)))
	}
}

// refsToPush lists what to push to keep the unpushed commits (a branch by
// its name, any other ref by its full name), plus the VM's branch when new
// commits are about to be made on it.
func (u *Unsaved) refsToPush(committing bool, branch string) []string {
	var out []string
	seen := map[string]bool{}
	if committing && branch != "" {
		out, seen[branch] = append(out, branch), true
	}
	for _, c := range u.Unpushed {
		ref := strings.TrimPrefix(c.Ref, "refs/heads/")
		if c.Ref != "HEAD" && !seen[ref] {
			seen[ref] = true
			out = append(out, ref)
		}
	}
	return out
}

// onBranch reports whether the VM's branch has commits to keep, or is
// about to get them (keep commits the uncommitted changes there).
func (u *Unsaved) onBranch(branch string) bool {
	if branch == "" {
		return false
	}
	for _, c := range u.Unpushed {
		if c.Ref == "refs/heads/"+branch {
			return true
		}
	}
	return len(u.Changed) > 0 || len(u.Untracked) > 0
}

// allRisky lists the risky settings of u and its submodules, the latter
// prefixed with where they are.
func (u *Unsaved) allRisky(prefix string) []string {
	var out []string
	for _, r := range u.Risky {
		out = append(out, prefix+r)
	}
	for _, s := range u.Submodules {
		out = append(out, s.allRisky(prefix+"submodule "+s.Path+": ")...)
	}
	return out
}

// refLabel names a ref in a list of commits: a branch by its name, a tag
// as "tag NAME", anything else by its full name.
func refLabel(ref string) string {
	if b, ok := strings.CutPrefix(ref, "refs/heads/"); ok {
		return termsafe.String(b)
	}
	if t, ok := strings.CutPrefix(ref, "refs/tags/"); ok {
		return "tag " + termsafe.String(t)
	}
	return termsafe.String(ref)
}

func section(b *strings.Builder, indent string, items []string, one, many string) {
	if len(items) == 0 {
		return
	}
	noun := many
	if len(items) == 1 {
		noun = one
	}
	fmt.Fprintf(b, "%s%d %s:\n", indent, len(items), noun)
	for i, it := range items {
		if i == maxListed {
			fmt.Fprintf(b, "%s  ... and %d more\n", indent, len(items)-maxListed)
			break
		}
		fmt.Fprintf(b, "%s  %s\n", indent, termsafe.String(it))
	}
}
