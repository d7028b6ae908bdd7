package vm

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Which VM a command means.
//
// A VM belongs to one repository and one branch (state.Record.Git.Repo and
// Branch): two repositories can each have a VM for "main". What the user
// types, a branch or a VM name (slug), is resolved among the VMs of the
// repository the command runs in (Manager.WorkDir), never another's. Outside
// any repository it is resolved among all VMs, and only when exactly one
// matches. Both refusals list the candidates.

// List returns every VM directory, sorted by slug. Records written before
// VMs had a repository get it from the checkout they were created from,
// which is saved into the record when nobody else holds the VM.
func (m *Manager) List(ctx context.Context) ([]state.Entry, error) {
	entries, err := m.Root.List()
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.Record != nil && e.Record.Git.Repo == "" {
			m.migrateRepo(ctx, e)
		}
	}
	return entries, nil
}

// migrateRepo fills in an old record's repository from its source checkout.
// A source that is gone leaves it empty: that VM then matches no repository
// and is found from outside any repository only.
func (m *Manager) migrateRepo(ctx context.Context, e state.Entry) {
	if e.Record.Git.Source == "" {
		return
	}
	id, err := m.Git.RepoID(ctx, e.Record.Git.Source)
	if err != nil {
		return
	}
	e.Record.Git.Repo = id
	lock, ok, err := m.Root.TryLockVM(e.Slug)
	if err != nil || !ok {
		return // busy: the next command saves it
	}
	defer lock.Release()
	rec, err := state.ReadRecord(e.Layout.Record())
	if err != nil || rec.Git.Repo != "" {
		return
	}
	rec.Git.Repo = id
	if err := state.WriteRecord(e.Layout.Record(), rec); err != nil {
		m.Log.Debug("saving the repository of an old record", "vm", e.Slug, "error", err)
	}
}

// here is the repository a command runs in.
type here struct {
	repo string // gitws.RepoID; "" outside any repository
	top  string // the checkout's top level, for messages
}

// whereAmI finds the repository of m.WorkDir. A VM's own workspace counts
// as the repository that VM belongs to.
func (m *Manager) whereAmI(ctx context.Context, entries []state.Entry) here {
	if m.WorkDir == "" {
		return here{}
	}
	// By path: git refuses to read a workspace the guest's uid owns.
	for _, e := range entries {
		if e.Record != nil && within(m.WorkDir, e.Layout.Workspace()) {
			return here{repo: e.Record.Git.Repo, top: e.Layout.Workspace()}
		}
	}
	if !gitws.MaybeInside(m.WorkDir, m.Getenv) {
		return here{} // no .git here or above: git would say so, slower
	}
	top, id, err := m.Git.Where(ctx, m.WorkDir)
	if err != nil {
		return here{}
	}
	return here{repo: id, top: top}
}

// within reports whether dir is root or inside it, symlinks resolved.
func within(dir, root string) bool {
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	if r, err := filepath.EvalSymlinks(root); err == nil {
		root = r
	}
	rel, err := filepath.Rel(root, dir)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// findRecorded is Find for the verbs that need the VM's record: a VM
// directory whose record is unreadable is its error.
func (m *Manager) findRecorded(ctx context.Context, name string) (state.Entry, error) {
	e, err := m.Find(ctx, name)
	if err != nil {
		return state.Entry{}, err
	}
	if e.Record == nil {
		return state.Entry{}, e.Err
	}
	return e, nil
}

// Find resolves what the user typed (a branch or a VM name) to a VM, within
// the repository the command runs in (see the top of this file). A VM
// directory with an unreadable record is returned when its name matches and
// nothing else does, so the caller can report it (or destroy --force it).
func (m *Manager) Find(ctx context.Context, name string) (state.Entry, error) {
	entries, err := m.List(ctx)
	if err != nil {
		return state.Entry{}, err
	}
	h := m.whereAmI(ctx, entries)
	var mine, others, broken []state.Entry
	slug, _ := state.Slug(name)
	for _, e := range entries {
		switch {
		case e.Record == nil:
			if e.Slug == name || e.Slug == slug {
				broken = append(broken, e)
			}
		case e.Record.Branch != name && e.Slug != name:
		case h.repo != "" && e.Record.Git.Repo == h.repo:
			mine = append(mine, e)
		default:
			others = append(others, e)
		}
	}
	if h.repo != "" {
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
			return state.Entry{}, state.NotFound(fmt.Sprintf("no VM for %q in the repository at %s; other repositories have one:\n%s\n(hint: run agent-vm in that repository, e.g. `cd %s`; a VM belongs to the repository it was created in)",
				name, h.top, candidates(others), sourceOf(others)))
		}
		if len(broken) == 1 {
			return broken[0], nil
		}
		return state.Entry{}, state.NotFound(fmt.Sprintf("no VM for branch %q in the repository at %s (hint: `agent-vm list` shows the VMs; `agent-vm create %s` makes one)", name, h.top, name))
	}
	all := append(others, broken...)
	switch len(all) {
	case 1:
		return all[0], nil
	case 0:
		return state.Entry{}, state.NotFound(fmt.Sprintf("no VM for branch %q in %s (hint: `agent-vm list` shows the VMs; `agent-vm create %s` makes one)", name, m.Root.Dir, name))
	}
	return state.Entry{}, fmt.Errorf("%q names more than one VM, and agent-vm is not running in a git repository that would choose:\n%s\n(hint: run agent-vm in the repository of the VM you mean, e.g. `cd %s`)", name, candidates(all), sourceOf(all))
}

// candidates lists VMs for a refusal, one per line.
func candidates(es []state.Entry) string {
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
func sourceOf(es []state.Entry) string {
	for _, e := range es {
		if e.Record != nil && e.Record.Git.Source != "" {
			return e.Record.Git.Source
		}
	}
	return "REPO"
}

// locked is a VM whose lock the caller holds, with its driver and its live
// state as the driver saw it once locked.
type locked struct {
	e    state.Entry
	lock *state.Lock
	d    driver.Driver
	mach driver.Machine
	live driver.Live
}

// lockedLook finds a VM with a readable record, takes its lock and inspects it.
// The caller releases h.lock.
func (m *Manager) lockedLook(ctx context.Context, name string) (*locked, error) {
	e, lock, err := m.lockedEntry(ctx, name)
	if err != nil {
		return nil, err
	}
	h := &locked{e: e, lock: lock, mach: m.machine(e.Record, e.Layout)}
	if h.d, err = m.driverOf(e.Record); err == nil {
		h.live, err = h.d.Inspect(ctx, h.mach)
	}
	if err != nil {
		lock.Release()
		return nil, err
	}
	return h, nil
}

// lockedEntry finds a VM with a readable record and takes its lock.
func (m *Manager) lockedEntry(ctx context.Context, name string) (state.Entry, *state.Lock, error) {
	e, err := m.findRecorded(ctx, name)
	if err != nil {
		return state.Entry{}, nil, err
	}
	lock, err := m.Root.LockVM(ctx, e.Slug)
	if err != nil {
		return state.Entry{}, nil, err
	}
	return e, lock, nil
}
