package vm

import (
	"context"
	"fmt"

	"github.com/agent-vm/agent-vm/internal/repoconfig"
	"github.com/agent-vm/agent-vm/internal/state"
)

// ResetOptions are reset's inputs.
type ResetOptions struct {
	// Force stops a running VM first; without it a running VM is refused.
	Force bool
}

// ResetResult says what reset did.
type ResetResult struct {
	Branch, Slug string
	Stopped      bool     // the VM was running and was stopped first
	Packages     []string // what its next boot installs
}

// Reset gives a VM a fresh root disk from its base (the driver's Destroy,
// then the backend's Reset):
// its next start boots it and provisions it again, the repository's
// config.toml packages re-read from the workspace now and its
// provision.sh at that boot. The workspace (a directory on the host), the
// keys (so the pinned host key), the ports and the rest of the record stay.
// A running VM is refused unless o.Force, which stops it first.
func (m *Manager) Reset(ctx context.Context, name string, o ResetOptions) (*ResetResult, error) {
	e, lock, err := m.Locked(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	r, l := e.Record, e.Layout
	be, err := m.Backend(r, "reset")
	if err != nil {
		return nil, err
	}
	d, err := m.driverOf(r)
	if err != nil {
		return nil, err
	}
	live, err := d.Inspect(ctx, m.machine(r, l))
	if err != nil {
		return nil, err
	}
	res := &ResetResult{Branch: r.Branch, Slug: r.Slug}
	if live.HasProcess() && !o.Force {
		return nil, fmt.Errorf("VM %q is %s; reset would throw away its root disk under it (hint: `agent-vm stop %s` first, or `agent-vm reset --force %s` stops it)", r.Branch, live.State, r.Slug, r.Slug)
	}
	c, err := m.repoConfig(ctx, e)
	if err != nil {
		return nil, err
	}
	if err := checkRepoPackages(c, be); err != nil {
		return nil, err
	}
	if live.HasProcess() {
		if _, err := m.stopLocked(ctx, e); err != nil {
			return nil, fmt.Errorf("stopping VM %q before the reset: %w", r.Branch, err)
		}
		res.Stopped = true
	}
	// The driver's own machine goes too (vagrant's libvirt domain, whose
	// disk is the VM's root disk); the next start makes it afresh.
	if err := d.Destroy(ctx, m.machine(r, l)); err != nil {
		return nil, fmt.Errorf("resetting VM %q: %w (the workspace and keys are unchanged; `agent-vm reset %s` tries again)", r.Branch, err, r.Slug)
	}
	if err := be.Reset(ctx, l, r); err != nil {
		return nil, err
	}
	r.RepoPackages = c.Packages
	r.Guest.Proxy = true // the fresh disk's first boot sets the proxy up
	res.Packages = r.AllPackages()
	if err := state.WriteRecord(l.Record(), r); err != nil {
		return nil, err
	}
	m.Log.With("vm", r.Slug).Info("reset: the next start boots a fresh disk", "packages", res.Packages)
	return res, nil
}

// repoConfig is the repository's settings as the VM's workspace now says:
// read here, or, for a VM placed on another host, read there.
func (m *Manager) repoConfig(ctx context.Context, e state.Entry) (*repoconfig.Config, error) {
	s, err := m.siteOf(e)
	if err != nil {
		return nil, err
	}
	if s != nil {
		return s.RepoConfig(ctx)
	}
	return repoconfig.Load(e.Layout.Workspace(), "")
}
