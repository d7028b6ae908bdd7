package vm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agent-vm/agent-vm/internal/boot"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestconn"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// Resume resumes a suspended VM; a VM that is not suspended is refused
// (start boots a stopped one), but for a wake, which wants it running.
func (m *Manager) Resume(ctx context.Context, name string, o StartOptions) (*StartResult, error) {
	h, err := m.lockedLook(ctx, name)
	if err != nil {
		return nil, err
	}
	defer h.lock.Release()
	e, live := h.e, h.live
	if o.Wake && live.State == vminfo.StateRunning { // woken meanwhile: its holder saw a connection
		return &StartResult{AlreadyRunning: true}, nil
	}
	if live.State != vminfo.StateSuspended {
		hint := "`agent-vm start " + e.Slug + "` starts it"
		if live.Alive() {
			hint = "it runs already"
		}
		return nil, fmt.Errorf("VM %q is %s, not suspended (hint: %s)", e.Record.Branch, live.State, hint)
	}
	if err := m.rebind(ctx, e, &h.mach, live); err != nil {
		return nil, err
	}
	return m.resume(ctx, e, h.d, h.mach, live, o)
}

// resume brings a suspended VM back (start calls it too): one paused in
// place by its driver's Pauser is continued, the same process; one saved
// is started from its saved state (and a vagrant VM's pause resumed by its
// driver's Resume). Then, as a start does, it waits for SSH, sets the
// guest's clock, mounts the workspace where the suspend unmounted it and
// waits for agent-mcp.
func (m *Manager) resume(ctx context.Context, e state.Entry, d driver.Driver, mach driver.Machine, live driver.Live, o StartOptions) (*StartResult, error) {
	if p, ok := d.(driver.Pauser); ok && live.InPlace() {
		o.Report.Report("continuing the VM "+live.Suspend, 0, "")
		began := time.Now()
		launch, err := p.Continue(ctx, mach)
		if err != nil {
			return nil, err
		}
		// The workspace stayed mounted and agent-mcp ran on; nothing of
		// the guest's set-up changed.
		return m.resumed(ctx, e, d, mach, o, resumed{launch: launch, began: began, keptShare: true})
	}
	r := e.Record
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
		BootTimeout: boot.ToolTimeout(o.Timeout, boot.ColdFor(acc.Accel))})
	if err != nil {
		if errors.Is(err, driver.ErrStaleState) {
			return nil, fmt.Errorf("VM %q: %w", r.Branch, err)
		}
		return nil, err
	}
	// A driver's suspend that kept the share mounted kept agent-mcp running.
	return m.resumed(ctx, e, d, mach, o, resumed{launch: launch, began: began, setup: plan.Setup, keptShare: sus.SuspendKeepsShare()})
}

// resumed is what resume's wait needs to know of the machine it brought
// back.
type resumed struct {
	launch *driver.Launch
	began  time.Time
	// setup is the backend's guest set-up of this start ("" for none).
	setup string
	// keptShare: the workspace stayed mounted and agent-mcp running.
	keptShare bool
}

// resumed waits for the guest that resume brought back: SSH, then its
// clock, set-up and workspace (guestctl.Ready), a new holder, agent-mcp.
func (m *Manager) resumed(ctx context.Context, e state.Entry, d driver.Driver, mach driver.Machine, o StartOptions, rs resumed) (*StartResult, error) {
	r := e.Record
	res := &StartResult{Resumed: true}
	if _, foreign := m.Foreign(r); foreign {
		return m.foreignReady(ctx, e, d, mach, res), nil
	}
	b := m.bootOf(e, d, mach, rs.launch, o)
	b.Began = rs.began
	w := b.Begin(ctx, boot.Resume)
	defer w.Done()
	// A hibernated VM's holder stayed: setting the clock over its held
	// connection shows the guest runs, sooner than a new SSH handshake.
	// Else the connection that answered readies the guest, and the holder
	// starts after the set-up (its login sees the placeholders).
	root, setup := m.rootOf(e), ""
	if m.guestOf(r, e.Layout).Held() == "" {
		c, ready, err := w.SSH("waiting for SSH after resume")
		if err != nil {
			return nil, err
		}
		defer c.Close()
		res.SSHReady = ready
		root, setup = guestconn.RootOn(c), rs.setup
	}
	_, err := w.Ready(root, guestctl.Readying{Now: m.Now, Setup: setup, Mount: !rs.keptShare})
	m.startHolder(e) // a hibernated VM's holder runs on (nothing is started); else it ended with the suspend
	if err != nil {
		return nil, fmt.Errorf("VM %q resumed, but: %w (hint: `agent-vm restart %s` boots it afresh)", r.Branch, err, e.Slug)
	}
	res.SSHReady = cmp.Or(res.SSHReady, time.Since(rs.began))
	if o.Wake {
		return res, nil
	}
	if err := m.restoredHealth(ctx, w, e, res, "resumed"); err != nil {
		return nil, err
	}
	res.Info = m.Status(ctx, e, true)
	return res, nil
}
