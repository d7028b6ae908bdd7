package vm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// SuspendOptions choose how suspend keeps a VM's memory. Neither set: a
// QEMU VM is saved to disk, unless processes in the guest use /workspace
// (or its machine cannot be saved), when it is paused in place.
type SuspendOptions struct {
	// Save insists on saving the VM to disk: a busy workspace refuses, as
	// does a driver whose suspend pauses (vagrant).
	Save bool
	// Pause pauses the VM in place even when it could be saved.
	Pause bool
	// Hibernate pauses it in place with its memory moved to disk
	// (driver.Hibernator); using it wakes it (internal/idle).
	Hibernate bool
}

// SuspendResult says what suspend did.
type SuspendResult struct {
	Branch string
	Took   time.Duration
	// Detail is the driver's word on the suspended VM (its status
	// detail): where its memory is kept.
	Detail string
	// Paused: the VM is paused in place, its QEMU (still running, its
	// CPUs stopped) holding its memory, HostRAM bytes of host RAM (0 when
	// the driver does not say); else it is saved to disk.
	Paused  bool
	HostRAM int64
	// Suspend is how the VM keeps its memory (vminfo.SuspendPaused ...).
	Suspend string
	// Why the VM was paused rather than saved, when suspend chose to: the
	// guest's processes that use /workspace (Busy, as guestctl.BusyError
	// lists them), or why its machine cannot be saved (CannotSave).
	Busy       string
	CannotSave string
}

// Suspend keeps a running VM's memory while no guest code runs, in one of
// two ways (driver.Live.Suspend says which):
//   - saved to disk: a QEMU VM's memory and devices go to its directory
//     and its QEMU ends. The guest's side first (driver.GuestHooks):
//     agent-mcp stops and /workspace is unmounted, which processes using
//     it prevent (guestctl.BusyError); resume undoes both.
//   - paused in place (driver.Pauser): its CPUs stop and its QEMU keeps
//     the memory in host RAM and every device, the workspace mounted, so
//     the processes using it are kept. A vagrant VM's suspend always
//     pauses (driver.Suspender's SuspendKeepsShare).
//
// Suspend saves when it can and pauses when processes use the workspace
// or the machine cannot be saved (a NixOS VM); o.Save and o.Pause insist
// on one way. A VM whose driver has neither way is refused.
func (m *Manager) Suspend(ctx context.Context, name string, o SuspendOptions) (*SuspendResult, error) {
	if o.Save && o.Pause || o.Hibernate && (o.Save || o.Pause) {
		return nil, errors.New("--save, --pause and --hibernate are ways of suspending: give one, or none to let suspend choose (hint: `agent-vm suspend --help`)")
	}
	h, err := m.lockedLook(ctx, name)
	if err != nil {
		return nil, err
	}
	defer h.lock.Release()
	e, d, mach, live := h.e, h.d, h.mach, h.live
	r := e.Record
	switch {
	case live.State == vminfo.StateSuspended:
		return nil, fmt.Errorf("VM %q is suspended already (hint: `agent-vm resume %s` resumes it)", r.Branch, e.Slug)
	case !live.Alive():
		return nil, fmt.Errorf("VM %q is %s, so there is nothing to suspend (hint: `agent-vm start %s` starts it): %w", r.Branch, live.State, e.Slug, driver.ErrNotRunning)
	case live.Launch == nil || live.Launch.ReadyAt == nil:
		return nil, fmt.Errorf("VM %q is still booting (hint: wait for `agent-vm start %s` to finish, then suspend it)", r.Branch, e.Slug)
	}
	sus, _ := d.(driver.Suspender)
	p, _ := d.(driver.Pauser)
	hib, _ := d.(driver.Hibernator)
	if err := checkSuspendWay(r.Branch, e.Slug, d.Name(), sus, p, hib, o); err != nil {
		return nil, err
	}
	began := time.Now()
	res := &SuspendResult{Branch: r.Branch}
	switch {
	case o.Hibernate:
		// Its holder wakes it on a connection: it must hold one first.
		m.startHolder(e)
		m.waitHolder(ctx, e, time.Minute)
		err = hib.Hibernate(ctx, mach)
	case o.Pause && p != nil:
		res.Paused = true
		err = p.Pause(ctx, mach)
	default:
		err = m.save(ctx, e, sus, mach, o.Save && p != nil)
		if !o.Save && p != nil && pauseInstead(err, res) {
			m.Log.Debug("pausing in place instead of saving", "vm", r.Branch, "why", err)
			res.Paused = true
			err = p.Pause(ctx, mach)
		}
	}
	if err != nil {
		return nil, err
	}
	res.Took = time.Since(began)
	if lv, err := d.Inspect(ctx, mach); err == nil { // the driver's word: a vagrant VM's suspend pauses
		res.Detail, res.Paused, res.HostRAM, res.Suspend = lv.Detail, lv.InPlace(), lv.Resident, lv.Suspend
	}
	// The holder ends by itself once QEMU is gone, and a paused guest
	// cannot answer its keepalives. A hibernated VM's stays (internal/idle):
	// it asks nothing of the guest, and wakes it on a connection.
	if res.Suspend != driver.SuspendHibernated {
		m.guestOf(e.Record, e.Layout).StopHolder(ctx)
	}
	return res, nil
}

// checkSuspendWay refuses a suspend the VM's driver cannot do the way o
// asks (sus, p and hib are its capabilities, nil when it lacks them).
func checkSuspendWay(branch, slug, driverName string, sus driver.Suspender, p driver.Pauser, hib driver.Hibernator, o SuspendOptions) error {
	pauses := sus != nil && sus.SuspendKeepsShare() // its suspend is a pause
	switch {
	case sus == nil && p == nil:
		return fmt.Errorf("VM %q cannot be suspended: the %s driver that runs it does not suspend machines (hint: `agent-vm stop %s` shuts it down instead): %w", branch, driverName, slug, driver.ErrUnsupported)
	case o.Save && (sus == nil || pauses):
		return fmt.Errorf("VM %q cannot be saved to disk: the %s driver that runs it only pauses machines in place (hint: `agent-vm suspend %s` without --save pauses it): %w", branch, driverName, slug, driver.ErrUnsupported)
	case o.Hibernate && hib == nil:
		return fmt.Errorf("VM %q cannot hibernate: the %s driver that runs it cannot move its memory to disk (hint: `agent-vm suspend %s` without --hibernate): %w", branch, driverName, slug, driver.ErrUnsupported)
	case o.Pause && p == nil && !pauses:
		return fmt.Errorf("VM %q cannot be paused in place: the %s driver that runs it does not pause machines (hint: `agent-vm suspend %s` without --pause): %w", branch, driverName, slug, driver.ErrUnsupported)
	}
	return nil
}

// save suspends e's VM through its driver's Suspend, with the guest's
// hooks; a busy workspace's refusal names the pause when pausable.
func (m *Manager) save(ctx context.Context, e state.Entry, sus driver.Suspender, mach driver.Machine, pausable bool) error {
	if sus == nil {
		return fmt.Errorf("VM %q cannot be saved: %w", e.Record.Branch, driver.ErrUnsupported)
	}
	instead := ""
	if pausable {
		instead = fmt.Sprintf("`agent-vm suspend %s` without --save pauses the VM in place, keeping them", e.Slug)
	}
	hooks := driver.GuestHooks{
		Detach: func(ctx context.Context) error { return m.detachGuest(ctx, e, instead) },
		Attach: func(ctx context.Context) error {
			_, err := guestctl.Ready(ctx, m.rootOf(e), guestctl.Readying{Mount: true}) // no setup: the mount's error
			return err
		},
	}
	return sus.Suspend(ctx, mach, hooks)
}

// pauseInstead reports whether a save that failed with err leaves the VM
// as it was for a pause, and notes why in res: the workspace is busy, or
// the machine cannot be saved (driver.ErrUnsupported, refused before
// anything changed).
func pauseInstead(err error, res *SuspendResult) bool {
	var busy *guestctl.BusyError
	switch {
	case errors.As(err, &busy):
		res.Busy = busy.Processes
	case errors.Is(err, driver.ErrUnsupported):
		res.CannotSave = err.Error()
	default:
		return false
	}
	return true
}

// detachGuest readies e's guest for its share to go (guestctl.Detach); a
// busy workspace's refusal names instead, when set, as the way to keep
// the processes that use it.
func (m *Manager) detachGuest(ctx context.Context, e state.Entry, instead string) error {
	err := guestctl.Detach(ctx, m.rootOf(e), e.Record.Branch, e.Slug)
	var busy *guestctl.BusyError
	if errors.As(err, &busy) {
		busy.Instead = instead
	}
	return err
}

// rootOf runs scripts as root in e's guest (runRoot).
func (m *Manager) rootOf(e state.Entry) guestctl.Root {
	return func(ctx context.Context, script func() string) (int, string, string, error) {
		return m.runRoot(ctx, e, script)
	}
}
