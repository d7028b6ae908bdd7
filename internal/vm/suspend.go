package vm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
)

// SuspendResult says what suspend did.
type SuspendResult struct {
	Branch string
	Took   time.Duration
	// Detail is the driver's word on the suspended VM (its status
	// detail): where its memory is kept, e.g. a vagrant VM's paused QEMU
	// that still holds it.
	Detail string
}

// Suspend keeps a running VM's memory while no guest code runs: a QEMU
// VM's is saved to its directory and its QEMU ends; a vagrant VM is paused
// (see driver.Suspender's SuspendKeepsShare). The guest's side, where the
// driver asks for it: agent-mcp stops and /workspace is unmounted (refused
// when a process uses it); resume undoes both. A VM whose driver is no
// driver.Suspender is refused.
func (m *Manager) Suspend(ctx context.Context, name string) (*SuspendResult, error) {
	h, err := m.lockedLook(ctx, name)
	if err != nil {
		return nil, err
	}
	defer h.lock.Release()
	e, d, mach, live := h.e, h.d, h.mach, h.live
	r := e.Record
	switch {
	case live.State == StateSuspended:
		return nil, fmt.Errorf("VM %q is suspended already (hint: `agent-vm resume %s` resumes it)", r.Branch, e.Slug)
	case !live.Alive():
		return nil, fmt.Errorf("VM %q is %s, so there is nothing to suspend (hint: `agent-vm start %s` starts it): %w", r.Branch, live.State, e.Slug, driver.ErrNotRunning)
	case live.Launch == nil || live.Launch.ReadyAt == nil:
		return nil, fmt.Errorf("VM %q is still booting (hint: wait for `agent-vm start %s` to finish, then suspend it)", r.Branch, e.Slug)
	}
	sus, ok := d.(driver.Suspender)
	if !ok {
		return nil, fmt.Errorf("VM %q cannot be suspended: the %s driver that runs it does not suspend machines (hint: `agent-vm stop %s` shuts it down instead): %w", r.Branch, d.Name(), e.Slug, driver.ErrUnsupported)
	}
	began := time.Now()
	hooks := driver.GuestHooks{
		Detach: func(ctx context.Context) error { return m.detachGuest(ctx, e) },
		Attach: func(ctx context.Context) error { return m.attachGuest(ctx, e, false) },
	}
	if err := sus.Suspend(ctx, mach, hooks); err != nil {
		return nil, err
	}
	res := &SuspendResult{Branch: r.Branch, Took: time.Since(began)}
	// The holder ends by itself once QEMU is gone; do not wait for its
	// keepalives. A paused (vagrant) guest cannot answer them either, and
	// its resume restarts the port forward the holder's connection uses.
	m.stopHolder(ctx, e)
	if lv, err := d.Inspect(ctx, mach); err == nil {
		res.Detail = lv.Detail
	}
	return res, nil
}

// detachGuest readies e's guest for its share to go (guestctl.Detach).
func (m *Manager) detachGuest(ctx context.Context, e state.Entry) error {
	return guestctl.Detach(ctx, m.rootOf(e), e.Record.Branch, e.Slug)
}

// attachGuest mounts the workspace again (guestctl.Attach), setting the
// clock when fixClock; setGuestClock only sets it (guestctl.SetClock).
func (m *Manager) attachGuest(ctx context.Context, e state.Entry, fixClock bool) error {
	return guestctl.Attach(ctx, m.rootOf(e), m.clock(fixClock))
}

func (m *Manager) setGuestClock(ctx context.Context, e state.Entry, fixClock bool) error {
	return guestctl.SetClock(ctx, m.rootOf(e), m.clock(fixClock))
}

// clock is the host's time to set a guest's clock to, or nil for none.
func (m *Manager) clock(fix bool) func() time.Time {
	if !fix {
		return nil
	}
	return m.Now
}

// rootOf runs scripts as root in e's guest (runRoot).
func (m *Manager) rootOf(e state.Entry) guestctl.Root {
	return func(ctx context.Context, script func() string) (int, string, string, error) {
		return m.runRoot(ctx, e, script)
	}
}

// resume starts a suspended VM from its saved state (start calls it), then
// waits for SSH, sets the guest's clock, mounts the workspace and waits
// for agent-mcp, as a start does.
func (m *Manager) resume(ctx context.Context, e state.Entry, d driver.Driver, mach driver.Machine, o StartOptions) (*StartResult, error) {
	r, l := e.Record, e.Layout
	sus, ok := d.(driver.Suspender)
	if !ok {
		return nil, fmt.Errorf("VM %q cannot be resumed: the %s driver that runs it does not suspend machines: %w", r.Branch, d.Name(), driver.ErrUnsupported)
	}
	acc := m.Accel(ctx)
	share, _ := d.Share(ctx)
	plan, err := m.prepare(ctx, e, d, o, share, &mach, "resume", nil)
	if err != nil {
		return nil, err
	}
	o.Report.Report("resuming from the saved state", 0, "")
	began := time.Now()
	launch, err := sus.Resume(ctx, mach, plan.Boot, driver.StartOptions{Accel: acc.Accel, AccelReason: acc.Reason, Share: share, FixedShare: true,
		BootTimeout: toolBootTimeout(o.Timeout, bootBaseFor(acc.Accel))})
	if err != nil {
		if errors.Is(err, driver.ErrStaleState) {
			return nil, fmt.Errorf("VM %q: %w", r.Branch, err)
		}
		return nil, err
	}
	res := &StartResult{Resumed: true}
	if r.Guest.Foreign != "" {
		return m.foreignReady(ctx, e, d, mach, res), nil
	}
	wctx, done := m.restoredWait(ctx, r.Slug, o.Timeout, resumeBase, d, mach, launch)
	defer done()
	target := m.guestOf(r, l).Target()
	client, err := sshx.WaitReady(wctx, target, nil)
	if err != nil {
		logs := d.Logs(mach)
		return nil, &BootError{VM: r.Branch, Phase: "waiting for SSH after resume", Err: err, ConsoleLog: logs.Console, Tail: driver.TailFile(logs.Console, 15)}
	}
	client.Close()
	res.SSHReady = time.Since(began)
	m.Log.Debug("ssh ready", "after", res.SSHReady)
	if err := d.MarkReady(mach, time.Now()); err != nil {
		m.Log.Warn("could not record that the VM is up", "error", err)
	}
	m.guestSetup(wctx, e, plan.Setup)
	m.startHolder(e) // the held connection ended with the suspend
	attach := m.attachGuest
	if sus.SuspendKeepsShare() {
		attach = m.setGuestClock // the share stayed mounted, agent-mcp running
	}
	if err := attach(wctx, e, true); err != nil {
		return nil, fmt.Errorf("VM %q resumed, but: %w (hint: `agent-vm restart %s` boots it afresh)", r.Branch, err, e.Slug)
	}
	if !guestctl.WaitHealthy(wctx, r.Ports.MCP) {
		m.Log.Warn("the VM resumed, but agent-mcp does not answer yet", "vm", r.Branch)
		res.Info = m.Status(ctx, e, true)
		return res, nil
	}
	res.HealthReady = time.Since(began)
	res.Info = m.Status(ctx, e, true)
	return res, nil
}

// Resume resumes a suspended VM; a VM that is not suspended is refused
// (start boots a stopped one).
func (m *Manager) Resume(ctx context.Context, name string, o StartOptions) (*StartResult, error) {
	h, err := m.lockedLook(ctx, name)
	if err != nil {
		return nil, err
	}
	defer h.lock.Release()
	e, live := h.e, h.live
	if live.State != StateSuspended {
		hint := "`agent-vm start " + e.Slug + "` starts it"
		if live.Alive() {
			hint = "it runs already"
		}
		return nil, fmt.Errorf("VM %q is %s, not suspended (hint: %s)", e.Record.Branch, live.State, hint)
	}
	return m.resume(ctx, e, h.d, h.mach, o)
}

// restoredWait bounds the wait for a guest restored from a saved state
// (the user's timeout, else base stretched by the host's load: bootWait)
// and ends it when its QEMU exits; done releases it.
func (m *Manager) restoredWait(ctx context.Context, slug string, timeout, base time.Duration, d driver.Driver, mach driver.Machine, launch *driver.Launch) (wctx context.Context, done func()) {
	wctx, cancel := m.bootWait(ctx, slug, timeout, base)
	wctx, stopWatch := m.watchQEMU(wctx, d, mach, launch)
	return wctx, func() { stopWatch(); cancel() }
}
