package state

import (
	"fmt"
	"strings"
)

// Which VM a name means.
//
// A VM belongs to one repository and one branch (Record.Git.Repo and
// Branch): two repositories can each have a VM for "main". What the user
// types, a branch or a VM name (slug), is resolved among the VMs of the
// repository the command runs in, never another's. Outside any repository
// it is resolved among all VMs, and only when exactly one matches. Both
// refusals list the candidates.

// Here is the repository a command runs in.
type Here struct {
	Repo string // gitws.RepoID; "" outside any repository
	Top  string // the checkout's top level, for messages
}

// Find resolves name (a branch or a VM name) among entries, within the
// repository h (see above); dir is the state directory, for messages. A
// VM directory with an unreadable record is returned when its name
// matches and nothing else does, so the caller can report it (or destroy
// --force it).
func Find(entries []Entry, name string, h Here, dir string) (Entry, error) {
	var mine, others, broken []Entry
	slug, _ := Slug(name)
	for _, e := range entries {
		switch {
		case e.Record == nil:
			if e.Slug == name || e.Slug == slug {
				broken = append(broken, e)
			}
		case e.Record.Branch != name && e.Slug != name:
		case h.Repo != "" && e.Record.Git.Repo == h.Repo:
			mine = append(mine, e)
		default:
			others = append(others, e)
		}
	}
	if h.Repo != "" {
		// A branch name wins over a VM name: branch "a.b" may have a VM
		// named "a-b" while another branch is called "a-b".
		for _, e := range mine {
			if e.Record.Branch == name {
				return e, nil
			}
		}
		if len(mine) == 1 {
			return mine[0], nil
		}
		if len(others) > 0 {
			return Entry{}, NotFound(fmt.Sprintf("no VM for %q in the repository at %s; other repositories have one:\n%s\n(hint: run agent-vm in that repository, e.g. `cd %s`; a VM belongs to the repository it was created in)",
				name, h.Top, candidates(others), sourceOf(others)))
		}
		if len(broken) == 1 {
			return broken[0], nil
		}
		return Entry{}, NotFound(fmt.Sprintf("no VM for branch %q in the repository at %s (hint: `agent-vm list` shows the VMs; `agent-vm create %s` makes one)", name, h.Top, name))
	}
	all := append(others, broken...)
	switch len(all) {
	case 1:
		return all[0], nil
	case 0:
		return Entry{}, NotFound(fmt.Sprintf("no VM for branch %q in %s (hint: `agent-vm list` shows the VMs; `agent-vm create %s` makes one)", name, dir, name))
	}
	return Entry{}, fmt.Errorf("%q names more than one VM, and agent-vm is not running in a git repository that would choose:\n%s\n(hint: run agent-vm in the repository of the VM you mean, e.g. `cd %s`)", name, candidates(all), sourceOf(all))
}

// candidates lists VMs for a refusal, one per line.
func candidates(es []Entry) string {
	var b strings.Builder
	for _, e := range es {
		if e.Record == nil {
			fmt.Fprintf(&b, "  VM %s (unreadable record)\n", e.Slug)
			continue
		}
		repo := e.Record.Git.Source
		if repo == "" {
			repo = "an unknown repository"
		}
		fmt.Fprintf(&b, "  VM %s: branch %q of %s\n", e.Slug, e.Record.Branch, repo)
	}
	return strings.TrimRight(b.String(), "\n")
}

// sourceOf is a checkout to suggest in a hint.
func sourceOf(es []Entry) string {
	for _, e := range es {
		if e.Record != nil && e.Record.Git.Source != "" {
			return e.Record.Git.Source
		}
	}
	return "REPO"
}
