package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/boot"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/secret"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// Reporter receives progress while a long step runs (see backend.Reporter).
type Reporter = backend.Reporter

// StartOptions are start's inputs.
type StartOptions struct {
	// Timeout bounds the wait for SSH and agent-mcp; 0 picks one for the
	// accelerator (TCG boots are several times slower than KVM).
	Timeout time.Duration
	Report  backend.Reporter
	// Reprovision, Nixpkgs: the backend's own start flags (each refuses
	// those that mean nothing for its guests).
	Reprovision bool
	Nixpkgs     string
	// Cold boots a suspended VM afresh, discarding its saved state.
	Cold bool
	// Wake: a hibernated VM resumed by a command that uses it: no wait for agent-mcp.
	Wake bool
	// NoTemplate boots a new VM cold even when a template fits it.
	NoTemplate bool
	// WorkspaceCache, when set, changes how the guest caches the workspace
	// (driver.ShareCache*) from this start on; the record keeps it.
	WorkspaceCache string
	// Secrets are this start's own, besides the store's (which win over
	// one of the same name): `run --agent`'s key from the host's
	// environment. A VM whose network is not contained gets none.
	Secrets []secret.Secret
}

// StartResult is what start did.
type StartResult struct {
	Info           vminfo.Info
	AlreadyRunning bool
	Resumed        bool          // from a saved state (suspend), not booted
	FromTemplate   bool          // a new VM started from a template's saved state
	NoTemplateYet  bool          // a new VM booted cold: no template fits its machine yet
	SSHReady       time.Duration // from launch to SSH answering with the pinned key
	HealthReady    time.Duration // from launch to agent-mcp's /health answering 200
}

// Start boots a VM and waits until its SSH and agent-mcp answer. A VM that
// is already running is left alone. Interrupting the wait (ctx) stops the VM
// again, so an aborted start leaves nothing running.
func (m *Manager) Start(ctx context.Context, name string, o StartOptions) (*StartResult, error) {
	h, err := m.lockedLook(ctx, name)
	if err != nil {
		return nil, err
	}
	defer h.lock.Release()
	e, d, mach, live := h.e, h.d, h.mach, h.live
	r, l := e.Record, e.Layout
	if live.Alive() {
		info := m.Status(ctx, e, true)
		if _, foreign := m.Foreign(r); info.State == vminfo.StateRunning && !foreign {
			// Its holder may have ended (a guest reboot), or an older agent-vm started it.
			m.startHolder(e)
			m.waitHolder(ctx, e, 10*time.Second)
			info.SSH.Held = m.guestOf(r, l).Held()
		}
		if o.WorkspaceCache != "" && o.WorkspaceCache != mach.Share.CacheMode() {
			return nil, fmt.Errorf("VM %q runs with workspace cache %s; a new mode takes effect at a start (hint: `agent-vm stop %s`, then `agent-vm start --workspace-cache %s %s`)", r.Branch, mach.Share.CacheMode(), e.Slug, o.WorkspaceCache, e.Slug)
		}
		return &StartResult{Info: info, AlreadyRunning: true}, nil
	}
	if err := m.setWorkspaceCache(e, &mach, o.WorkspaceCache); err != nil {
		return nil, err
	}
	if err := m.rebind(ctx, e, &mach, live); err != nil {
		return nil, err
	}
	if live.State == vminfo.StateSuspended {
		if !o.Cold {
			if o.Reprovision {
				return nil, fmt.Errorf("VM %q is suspended, and --reprovision needs a cold boot (hint: `agent-vm start --cold --reprovision %s` discards the saved state)", r.Branch, e.Slug)
			}
			return m.resume(ctx, e, d, mach, live, o)
		}
		// Paused in place: shut down cleanly (stopMachine's grace); saved: discarded.
		if _, err := m.stopMachine(ctx, d, mach); err != nil {
			return nil, fmt.Errorf("discarding the saved state of %q: %w", r.Branch, err)
		}
		m.Log.Warn("discarded the memory a suspended VM kept (its processes are gone); booting it afresh", "vm", r.Branch)
	}
	m.closeBridges(e) // a boot starts with no browser bridge open
	var acc accel.Result
	if mach.Remote == nil {
		acc = m.Accel(ctx)
	} // else the host probes its own KVM at the start (the libvirt driver)
	f, foreign := m.Foreign(r)
	switch {
	case acc.Accel == accel.TCG && foreign:
		// The guest's own configuration, not agent-vm, chooses the
		// accelerator.
		if f.NoKVM != "" {
			m.Log.Warn(f.NoKVM, "reason", acc.Reason, "config", f.Config)
		}
	case acc.Accel == accel.TCG:
		m.Log.Warn("KVM is not usable, running with TCG (software emulation; boots take about a minute)", "reason", acc.Reason, "hint", acc.Hint)
	}
	share, err := d.Share(ctx)
	if err != nil && !foreign { // a foreign guest's shares are its own
		m.Log.Warn("sharing the workspace over "+string(share), "reason", err)
	}
	if w := m.startWarning(r); w != "" {
		m.Log.Warn(w)
	}
	unprepared := mach
	unprepared.Credentials = slices.Clone(mach.Credentials)
	tmpl, noneYet := m.templateFor(ctx, e, o)
	plan, err := m.prepare(ctx, e, d, o, share, &mach, "start", tmpl)
	if tmpl != nil && errors.Is(err, backend.ErrTemplateMismatch) {
		m.Log.Warn("booting cold, not from the template: "+err.Error(), "vm", r.Branch)
		plan, err = m.prepare(ctx, e, d, o, share, &mach, "start", nil)
	}
	if err != nil {
		return nil, err
	}
	so := driver.StartOptions{Accel: acc.Accel, AccelReason: acc.Reason, Share: share, FixedShare: plan.FixedShare,
		BootTimeout: boot.ToolTimeout(o.Timeout, boot.ColdFor(acc.Accel))}
	if plan.Clone != nil {
		res, err := m.startClone(ctx, e, d, mach, plan, tmpl, so, o)
		var refused *templateRefused
		if !errors.As(err, &refused) {
			return res, err
		}
		m.Log.Warn("booting cold, not from the template: "+refused.Error(), "vm", r.Branch)
		mach = unprepared
		if plan, err = m.unclone(ctx, e, d, o, share, &mach); err != nil {
			return nil, err
		}
		so.FixedShare = plan.FixedShare
	}
	o.Report.Report("starting the VM ("+d.Name()+")", 0, "")
	launched := time.Now()
	launch, err := d.Start(ctx, mach, plan.Boot, so)
	if errors.Is(err, ports.ErrTaken) && m.rebind(ctx, e, &unprepared, live) == nil && !slices.Equal(mach.Forwards, unprepared.Forwards) {
		// Another program took a port agent-vm picked after rebind looked:
		// prepared again (a NixOS build has its ports) on the moved one.
		mach = unprepared
		if plan, err = m.prepare(ctx, e, d, o, share, &mach, "start", nil); err == nil {
			so.FixedShare = plan.FixedShare
			launch, err = d.Start(ctx, mach, plan.Boot, so)
		}
	}
	if err != nil {
		return nil, err
	}
	res := &StartResult{NoTemplateYet: noneYet}
	if foreign {
		return m.foreignReady(ctx, e, d, mach, res), nil
	}
	if err := m.waitReady(ctx, e, d, mach, launch, o, plan, res); err != nil {
		if ctx.Err() != nil {
			// Interrupted: undo the start, without the caller's dead ctx.
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = d.Stop(sctx, mach, 5*time.Second)
			return nil, fmt.Errorf("start of %q interrupted; the VM was stopped again: %w", r.Branch, ctx.Err())
		}
		return nil, err
	}
	if err := m.checkProvision(ctx, e, launched); err != nil {
		return nil, err
	}
	m.waitHolder(ctx, e, 10*time.Second)
	res.Info = m.Status(ctx, e, true)
	return res, nil
}

// prepare has the VM's backend check the start's flags and prepare its
// boot (see backend.Backend's Prepare), saves what that changed in the
// record, and completes mach with the plan's credentials and, for a driver
// that contains it, the VM's network.
func (m *Manager) prepare(ctx context.Context, e state.Entry, d driver.Driver, o StartOptions, share driver.ShareMode, mach *driver.Machine, verb string, t *usable) (*backend.Plan, error) {
	r, l := e.Record, e.Layout
	be, err := m.Backend(r, verb)
	if err != nil {
		return nil, err
	}
	flags := backend.StartFlags{Reprovision: o.Reprovision, Nixpkgs: o.Nixpkgs}
	if err := be.CheckStart(r, flags); err != nil {
		return nil, err
	}
	var cas []string
	if !r.NoHostCA {
		if cas, err = m.HostCAs(); err != nil {
			return nil, err
		}
	}
	contained := m.contains(d, r)
	var sec *secret.Start
	if contained && !m.templates {
		if sec, err = m.secretsFor(e, o.Secrets); err != nil {
			return nil, err
		}
		cas = append(cas, sec.CACert)
	}
	section := slices.Clone(r.Settings)
	po := backend.PrepareOptions{StartFlags: flags, Share: share, Report: o.Report, CACerts: cas}
	if sec != nil {
		po.Placeholders, po.GitCredentials = sec.Placeholders, sec.GitCredentials
	}
	if t != nil {
		po.Template = t.e.Layout.Dir
		po.TemplateAgents = slices.Collect(maps.Keys(t.rec.Agents))
	}
	plan, err := be.Prepare(ctx, l, r, po)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(section, r.Settings) {
		if err := state.WriteRecord(l.Record(), r); err != nil {
			return nil, err
		}
	}
	mach.Credentials = append(mach.Credentials, plan.Credentials...)
	if contained {
		if mach.Network, err = m.network(r, l); err != nil {
			return nil, err
		}
		if sec != nil && sec.Bundle != nil {
			mach.Network.Proxy = append(mach.Network.Proxy, "--secrets-stdin")
			mach.Network.ProxyInput = sec.Bundle
		}
	}
	return plan, nil
}

// startWarning is what r's backend warns of at its start
// (backend.StartWarner: a Debian guest set up before network containment;
// NixOS guests get the proxy from the configuration every start builds).
func (m *Manager) startWarning(r *state.Record) string {
	if w, ok := m.Backends[r.Backend].(backend.StartWarner); ok {
		return w.StartWarning(r)
	}
	return ""
}

// setWorkspaceCache saves a start's --workspace-cache in the record and
// the machine ("" leaves both as they are).
func (m *Manager) setWorkspaceCache(e state.Entry, mach *driver.Machine, mode string) error {
	r := e.Record
	if mode == "" || mode == r.WorkspaceCache {
		return nil
	}
	if err := driver.CheckShareCache(mode); err != nil {
		return err
	}
	r.WorkspaceCache = mode
	mach.Share.Cache = mode
	return state.WriteRecord(e.Layout.Record(), r)
}
