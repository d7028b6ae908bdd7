package vm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/boot"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/guestconn"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/template"
)

// A VM's first start from a template (internal/template): clone its
// machine, give the guest the VM's identity, mount the workspace, finish
// the guest's setup.

// usable is a usable template for a VM.
type usable struct {
	e    state.Entry
	rec  template.Record
	mach driver.Machine
}

// findTemplate returns the template r fits, or why there is none (one
// line, for the log).
func (m *Manager) findTemplate(ctx context.Context, r *state.Record) (*usable, string) {
	if m.TemplateDir == nil {
		return nil, "templates are off"
	}
	be, ok := m.templater(r)
	if !ok {
		return nil, "only Debian (qemu backend) VMs start from templates"
	}
	if _, found := template.Newest(m.TemplateDir.Path, ""); !found {
		return nil, template.None(r.Slug) // without any template, skip hashing the key (agent-vm's binary among it)
	}
	k, err := m.templateKey(ctx, be, r)
	if err != nil {
		return nil, err.Error()
	}
	f, why := template.Find(m.TemplateDir.Path, k, r.Slug, r.AllPackages())
	if f == nil {
		return nil, why
	}
	return &usable{e: f.Entry, rec: f.Record, mach: m.machine(f.Entry.Record, f.Entry.Layout)}, ""
}

// startClone is a VM's first start from a template (see
// internal/template), after its backend prepared plan on the template's disk. A
// template the driver refuses, or a driver that is no driver.Cloner, is
// templateRefused: the caller boots cold.
func (m *Manager) startClone(ctx context.Context, e state.Entry, d driver.Driver, mach driver.Machine, plan *backend.Plan, t *usable, so driver.StartOptions, o StartOptions) (*StartResult, error) {
	r, l := e.Record, e.Layout
	cloner, ok := d.(driver.Cloner)
	if !ok {
		return nil, &templateRefused{fmt.Errorf("the %s driver cannot start a machine from a template: %w", d.Name(), driver.ErrUnsupported)}
	}
	o.Report.Report("starting from the template", 0, "")
	began := time.Now()
	edits, id, err := template.CloneEdits(t.rec.BootID)
	if err != nil {
		return nil, &templateRefused{err}
	}
	if id == "" {
		m.Log.Info("this VM shares its template's kernel boot id until it reboots: the template does not say where its kernel keeps it", "vm", r.Branch)
	}
	launch, err := cloner.Clone(ctx, mach, plan.Boot, so, t.mach, edits)
	if err != nil {
		if errors.Is(err, driver.ErrStaleState) {
			return nil, &templateRefused{err}
		}
		return nil, err
	}
	log := m.Log.With("vm", r.Branch)
	log.Debug("restored the template's machine", "after", time.Since(began))
	bm := m.bootOf(e, d, mach, launch, o)
	bm.Began = began
	w := bm.Begin(ctx, boot.Clone)
	defer w.Done()
	res := &StartResult{FromTemplate: true}
	fail := func(phase string, err error) (*StartResult, error) {
		var be *boot.Error
		if !errors.As(err, &be) {
			be = w.Fail(phase, err)
		}
		be.Err, be.Stopped = fmt.Errorf("%w (`agent-vm reset --force %s` then `agent-vm start --no-template %s` boots it cold)", be.Err, e.Slug, e.Slug), true
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(sctx, mach, 0) // a half-made identity must not be left running
		return nil, be
	}
	// The guest is the template's until Personalize: its host key and
	// client key. Its clock is the template's too, read at the end of the
	// same session.
	out, err := w.As(t.e.Layout, l.Run("template_known_hosts"), plan.Clone.Personalize+guestctl.ReadClock)
	if err != nil {
		return fail("giving the guest its identity", err)
	}
	off, err := guestctl.OffsetOf(out, m.Now())
	if err != nil {
		return fail("giving the guest its identity", err)
	}
	log.Debug("the guest has its identity", "after", time.Since(began), "clock_behind", off)
	c, ready, err := w.SSH("waiting for SSH with the VM's own keys")
	if err != nil {
		return fail("waiting for SSH with the VM's own keys", err)
	}
	defer c.Close()
	res.SSHReady = ready
	// The clock, the start's setup (as after a cold boot) and the workspace
	// (plugged in by the restore) in one root session, with a quick first
	// run (see backend.Clone), else the first run then, over the
	// connection that answered: no other login on the way.
	readying := guestctl.Readying{Clock: &off, Setup: plan.Setup, Mount: true}
	if plan.Clone.Quick {
		readying.FirstRun = plan.Clone.FirstRun
	}
	rd, err := w.Ready(guestconn.RootOn(c), readying)
	m.startHolder(e) // after the setup: its login sees the placeholders
	if err != nil {
		return fail("mounting the workspace", err)
	}
	log.Debug("the workspace is mounted", "after", time.Since(began))
	if err = rd.FirstRunErr; !plan.Clone.Quick {
		err = w.Settle(ctx, c, guestctl.Settling{Command: guest.RootShell, Input: plan.Clone.FirstRun, Log: guest.ProvisionLog})
	}
	m.settled(ctx, r, err, "")
	if err := m.restoredHealth(ctx, w, e, res, "started from its template"); err != nil {
		return nil, err
	}
	if res.HealthReady > 0 && !plan.Clone.Quick { // a quick first run had nothing to provision
		if err := m.checkProvision(ctx, e, began); err != nil {
			return nil, err
		}
	}
	if res.HealthReady > 0 {
		m.waitHolder(ctx, e, 10*time.Second)
	}
	res.Info = m.Status(ctx, e, true)
	return res, nil
}

// templateFor is the template a start of e uses: only a VM's first
// start (its backend has no disk for it yet), without --reprovision or
// --no-template, and only a template that fits. Why there is none is
// logged in one line.
//
// noneYet: the VM could have started from a template, and there is none
// for its machine (the user may want one: see template.Templates.Hint).
func (m *Manager) templateFor(ctx context.Context, e state.Entry, o StartOptions) (t *usable, noneYet bool) {
	be, err := m.Backend(e.Record, "start")
	if err != nil || be.ImagesInUse(e.Layout) != nil || m.TemplateDir == nil {
		return nil, false
	}
	if o.NoTemplate || o.Reprovision {
		m.Log.Info("booting cold, not from a template: --no-template or --reprovision", "vm", e.Record.Branch)
		return nil, false
	}
	t, why := m.findTemplate(ctx, e.Record)
	if t == nil {
		m.Log.Info("booting cold, not from a template: "+why, "vm", e.Record.Branch)
		return nil, why == template.None(e.Record.Slug)
	}
	if _, has := t.rec.Agents[e.Record.Agent]; e.Record.Agent != "" && !has {
		m.Log.Info("the template has no "+e.Record.Agent+": this VM installs it from npm (minutes without KVM); `agent-vm template build --agents` with it makes new VMs start with it", "vm", e.Record.Branch)
	}
	return t, false
}

// unclone undoes a start's disk made on a template the driver refused
// (the backend's Reset: a VM that never ran loses nothing) and prepares
// a cold boot instead.
func (m *Manager) unclone(ctx context.Context, e state.Entry, d driver.Driver, o StartOptions, share driver.ShareMode, mach *driver.Machine) (*backend.Plan, error) {
	be, err := m.Backend(e.Record, "start")
	if err != nil {
		return nil, err
	}
	if err := be.Reset(ctx, e.Layout, e.Record); err != nil {
		return nil, err
	}
	if err := state.WriteRecord(e.Layout.Record(), e.Record); err != nil {
		return nil, err
	}
	return m.prepare(ctx, e, d, o, share, mach, "start", nil)
}

// templateRefused is a template the driver found not to fit this VM.
type templateRefused struct{ err error }

func (e *templateRefused) Error() string { return e.err.Error() }
func (e *templateRefused) Unwrap() error { return e.err }
