package vm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/hostlink"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// UnsavedError is a destroy refused because the workspace holds work that
// exists nowhere else. Its message says what and how to keep it.
type UnsavedError struct {
	Report string
}

func (e *UnsavedError) Error() string { return e.Report }

// DestroyResult says what destroy did.
type DestroyResult struct {
	Branch  string
	Slug    string
	Stopped bool // the VM was running and was stopped first
}

// Destroy stops the VM if it runs and removes its directory, unless the
// workspace holds unsaved work (then it refuses, saying what would be lost,
// and leaves the VM as it was) or force is set. Nothing outside the VM's
// directory is ever removed, and the directory never while its QEMU runs:
// with the record unreadable, QEMU is found from what the run directory
// still has (see driver.Adopter).
func (m *Manager) Destroy(ctx context.Context, name string, force bool) (*DestroyResult, error) {
	e, err := m.Find(ctx, name)
	if err != nil {
		return nil, err
	}
	lock, err := m.Root.LockVM(ctx, e.Slug)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	res := &DestroyResult{Slug: e.Slug}
	d, err := m.driverOf(e.Record)
	if err != nil {
		return nil, err
	}
	var mach driver.Machine
	if e.Record == nil {
		if !force {
			return nil, fmt.Errorf("the VM directory %s has an unreadable record: %v (hint: agent-vm cannot check it for unsaved work; look inside, then `agent-vm destroy %s --force`)", e.Layout.Dir, e.Err, e.Slug)
		}
		mach = unrecordedMachine(e)
		if a, ok := d.(driver.Adopter); ok {
			mach = a.Adopt(ctx, mach)
		}
	} else {
		res.Branch = e.Record.Branch
		// A refused destroy changes nothing, so look before stopping; and
		// look again once the VM is stopped, since the agent may have
		// written more in between.
		if !force {
			if err := m.checkUnsaved(ctx, e); err != nil {
				return res, err
			}
		}
		mach = m.machine(e.Record, e.Layout)
	}
	live, err := m.stopMachine(ctx, d, mach)
	gone := false // the VM's host cannot be reached, and force forgets it
	switch {
	case err != nil && mach.Remote != nil && errors.Is(err, hostlink.ErrUnreachable):
		if !force {
			return nil, fmt.Errorf("stopping VM %q before destroying it: %w (hint: nothing was removed; if host %s is gone for good, `agent-vm destroy %s --force` forgets the VM here, leaving whatever it had there)", res.Branch, err, mach.Remote.Host, e.Slug)
		}
		gone = true
		m.Log.Warn("the VM's host cannot be reached: forgetting the VM here; its domain, network and files there stay until removed there", "vm", e.Slug, "host", mach.Remote.Host, "dir", mach.Remote.Dir, "error", err)
	case err != nil:
		return nil, destroyStopError(e, live, err)
	}
	m.guestOf(e.Record, e.Layout).StopHolder(ctx)
	res.Stopped = live.HasProcess()
	if !force && res.Stopped {
		if err := m.checkUnsaved(ctx, e); err != nil {
			return res, err
		}
	}
	// A VM placed on another host goes with its files there, its
	// workspace among them (the check above found nothing there that is
	// not saved here): RemoveFromHost is the driver's Destroy and that in
	// one request. With the host gone, it still ends what runs here for
	// the VM, its forwards, before it fails to reach the host.
	remove := d.Destroy
	if s, err := m.site(e.Record, mach); err != nil {
		return nil, err
	} else if s != nil {
		remove = s.Placer.RemoveFromHost
	}
	if err := remove(ctx, mach); err != nil && !(gone && errors.Is(err, hostlink.ErrUnreachable)) {
		return nil, err
	}
	// What a backend made that would outlive a half-removed directory goes
	// first (the directory is renamed into .trash, then deleted). With an
	// unreadable record every backend releases what it may have made.
	for _, be := range m.backendsOf(e) {
		if err := be.Release(e.Layout); err != nil {
			return nil, fmt.Errorf("releasing what the %s backend made for VM %s: %w", be.Name(), e.Slug, err)
		}
	}
	if err := m.Root.Remove(e.Slug); err != nil {
		return nil, err
	}
	return res, nil
}

// destroyStopError explains a destroy refused because the VM did not stop:
// its directory, the only handle on its QEMU, was left as it was.
func destroyStopError(e state.Entry, live driver.Live, err error) error {
	name := e.Slug
	if e.Record != nil {
		name = e.Record.Branch
	}
	if live.Pid == 0 || errors.Is(err, context.Canceled) {
		return fmt.Errorf("stopping VM %q before destroying it: %w (hint: nothing was removed; `agent-vm destroy %s --force` tries again)", name, err, e.Slug)
	}
	return fmt.Errorf("QEMU (pid %d) of VM %q did not stop, so nothing was removed: %w (hint: end it with `kill -9 %d`, then run `agent-vm destroy %s --force` again)", live.Pid, name, err, live.Pid, e.Slug)
}

// checkUnsaved refuses when the workspace holds work found nowhere else.
func (m *Manager) checkUnsaved(ctx context.Context, e state.Entry) error {
	if s, err := m.siteOf(e); err != nil {
		return err
	} else if s != nil {
		u, err := s.Unsaved(ctx, e.Record.Git.Source, e.Record.Branch, e.Slug)
		if err != nil || u.Empty() {
			return err
		}
		ws := s.Paths().Workspace
		return &UnsavedError{Report: u.Report(ws, e.Record.Branch, e.Slug) + fmt.Sprintf("\n(the workspace is %s on host %s)", ws, s.Host())}
	}
	ws := e.Layout.Workspace()
	if _, err := os.Stat(ws); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if !gitws.IsRepo(ws) {
		return &UnsavedError{Report: fmt.Sprintf("the workspace %s is no longer a git repository, so agent-vm cannot tell what would be lost (hint: copy out what you need, then `agent-vm destroy %s --force`)", ws, e.Slug)}
	}
	u, err := m.Git.Inspect(ctx, ws, e.Record.Git.Source)
	if err != nil {
		// git's errors quote the workspace (config values, paths): escaped.
		return fmt.Errorf("checking the workspace for unsaved work: %s (hint: `agent-vm destroy %s --force` skips the check and loses whatever is there)", termsafe.String(err.Error()), e.Slug)
	}
	if u.Empty() {
		return nil
	}
	return &UnsavedError{Report: u.Report(ws, e.Record.Branch, e.Slug)}
}

// backendsOf is the backend of e's VM, or every backend when its record
// cannot say which.
func (m *Manager) backendsOf(e state.Entry) []backend.Backend {
	if e.Record != nil {
		if be, ok := m.Backends[e.Record.Backend]; ok {
			return []backend.Backend{be}
		}
	}
	var all []backend.Backend
	for _, name := range slices.Sorted(maps.Keys(m.Backends)) {
		all = append(all, m.Backends[name])
	}
	return all
}
