package vm

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Which VM a command means: state.Find, within the repository the
// command runs in (Manager.WorkDir, whereAmI).

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

// migrateRepo fills in an old record's repository (state.Root.MigrateRepo).
func (m *Manager) migrateRepo(ctx context.Context, e state.Entry) {
	if err := m.Root.MigrateRepo(e, func(source string) (string, error) { return m.Git.RepoID(ctx, source) }); err != nil {
		m.Log.Debug("saving the repository of an old record", "vm", e.Slug, "error", err)
	}
}

// whereAmI finds the repository of m.WorkDir. A VM's own workspace counts
// as the repository that VM belongs to.
func (m *Manager) whereAmI(ctx context.Context, entries []state.Entry) state.Here {
	if m.WorkDir == "" {
		return state.Here{}
	}
	// By path: git refuses to read a workspace the guest's uid owns.
	for _, e := range entries {
		if e.Record != nil && within(m.WorkDir, e.Layout.Workspace()) {
			return state.Here{Repo: e.Record.Git.Repo, Top: e.Layout.Workspace()}
		}
	}
	if !gitws.MaybeInside(m.WorkDir, m.Getenv) {
		return state.Here{} // no .git here or above: git would say so, slower
	}
	top, id, err := m.Git.Where(ctx, m.WorkDir)
	if err != nil {
		return state.Here{}
	}
	return state.Here{Repo: id, Top: top}
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

// Recorded finds the VM name means (see Find), for the verbs that need
// its record: a VM directory whose record is unreadable is its error.
func (m *Manager) Recorded(ctx context.Context, name string) (state.Entry, error) {
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
// the repository the command runs in (state.Find).
func (m *Manager) Find(ctx context.Context, name string) (state.Entry, error) {
	entries, err := m.List(ctx)
	if err != nil {
		return state.Entry{}, err
	}
	return state.Find(entries, name, m.whereAmI(ctx, entries), m.Root.Dir)
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
	e, lock, err := m.Locked(ctx, name)
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

// Locked finds the VM name means, as Recorded, and takes its lock; the
// caller releases it.
func (m *Manager) Locked(ctx context.Context, name string) (state.Entry, *state.Lock, error) {
	e, err := m.Recorded(ctx, name)
	if err != nil {
		return state.Entry{}, nil, err
	}
	lock, err := m.Root.LockVM(ctx, e.Slug)
	if err != nil {
		return state.Entry{}, nil, err
	}
	return e, lock, nil
}
