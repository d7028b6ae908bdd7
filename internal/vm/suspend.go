package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
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

// BusyError is a suspend refused because processes in the guest use
// /workspace, which a suspend unmounts.
type BusyError struct {
	Branch, Slug string
	Processes    string // the guest's list: pid, command line, how
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("VM %q cannot be suspended: these processes in the guest use %s, which a suspend unmounts:\n%s\n(hint: end them first (`agent-vm sessions %s` lists agent sessions; leave shells that are in %s), or keep the VM running; `agent-vm stop %s` shuts it down instead)",
		e.Branch, guest.Workspace, indent(e.Processes), e.Slug, guest.Workspace, e.Slug)
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

// detachScript readies the guest for its share to go (as root): lists the
// processes using /workspace other than agent-mcp's (which stops), and
// refuses (exit 3) if there are any; else stops agent-mcp, syncs and
// unmounts. A process can be reported as using the workspace by its
// working directory, an open file or a mapped one.
//
// One find and one grep look at every process: a readlink per open file,
// as this script first did, was about a thousand processes, 25-30 s of
// every suspend under TCG. Only a process found busy costs more.
const detachScript = `set -u
ws=` + guest.Workspace + `
mountpoint -q "$ws" || exit 0
busy() {
	hits=$( {
		find /proc/[0-9]*/cwd /proc/[0-9]*/fd -maxdepth 1 \( -lname "$ws" -o -lname "$ws/*" \) -printf '%p\t%l\n'
		grep -l -F " $ws/" /proc/[0-9]*/maps | sed 's/$/\tmapped/'
	} 2>/dev/null )
	[ -n "$hits" ] || return 0
	for pid in $(printf '%s\n' "$hits" | cut -d/ -f3 | sort -un); do
		[ "$pid" = "$$" ] && continue
		grep -q 'agent-mcp\.service' "/proc/$pid/cgroup" 2>/dev/null && continue
		mine=$(printf '%s\n' "$hits" | grep "^/proc/$pid/")
		how=
		printf '%s\n' "$mine" | grep -q "^/proc/$pid/cwd	" && how="working directory"
		f=$(printf '%s\n' "$mine" | grep "^/proc/$pid/fd/" | head -n 1 | cut -f 2)
		[ -n "$f" ] && how="${how:+$how, }open file $f"
		printf '%s\n' "$mine" | grep -q "^/proc/$pid/maps	" && how="${how:+$how, }mapped file"
		[ -n "$how" ] && printf '%s %s (%s)\n' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-100)" "$how"
	done
	return 0
}
out=$(busy)
if [ -n "$out" ]; then printf '%s\n' "$out"; exit 3; fi
systemctl stop agent-mcp.service
sync
if ! umount "$ws" 2>/dev/null; then
	busy
	systemctl start --no-block agent-mcp.service
	exit 3
fi
`

// clockScript sets the guest's clock (as root) when $1, the host's time
// (seconds since the epoch, with nanoseconds), is set: a restored guest
// keeps the time it was saved at, a paused one the time it was paused at.
// Run alone, its exit status is date's; in attachScript a failed date does
// not keep the share from being mounted.
const clockScript = `set -u
if [ -n "${1:-}" ]; then date -u -s "@$1" >/dev/null; fi
`

// attachScript sets the clock (clockScript), mounts the share again once
// its device is back (as root) and starts agent-mcp.
const attachScript = clockScript + `for _ in $(seq 1 120); do
	for d in /sys/bus/virtio/devices/*; do
		case $(cat "$d/device" 2>/dev/null) in 0x001a|0x0009) break 2;; esac
	done
	sleep 0.5
done
/usr/local/lib/agent-vm/mount-workspace >/dev/null || exit 1
systemctl start agent-mcp.service
`

// detachGuest runs detachScript; a busy workspace is a *BusyError.
func (m *Manager) detachGuest(ctx context.Context, e state.Entry) error {
	code, out, errOut, err := m.runRoot(ctx, e, func() string { return detachScript })
	switch {
	case err != nil:
		return fmt.Errorf("readying the guest of %q for suspend: %w", e.Record.Branch, err)
	case code == 3:
		return &BusyError{Branch: e.Record.Branch, Slug: e.Slug, Processes: termsafe.String(strings.TrimSpace(out))}
	case code != 0:
		return fmt.Errorf("readying the guest of %q for suspend: exit %d: %s", e.Record.Branch, code, termsafe.String(strings.TrimSpace(errOut)))
	}
	return nil
}

// attachGuest runs attachScript, setting the clock when fixClock.
func (m *Manager) attachGuest(ctx context.Context, e state.Entry, fixClock bool) error {
	if err := m.runClocked(ctx, e, attachScript, fixClock); err != nil {
		return fmt.Errorf("mounting the workspace in the guest again: %w", err)
	}
	return nil
}

// setGuestClock runs clockScript: what a resume needs of the guest when
// its driver kept the share mounted (driver.Suspender's SuspendKeepsShare).
// It has attachGuest's signature so that resume can pick either.
func (m *Manager) setGuestClock(ctx context.Context, e state.Entry, fixClock bool) error {
	if err := m.runClocked(ctx, e, clockScript, fixClock); err != nil {
		return fmt.Errorf("setting the guest's clock: %w", err)
	}
	return nil
}

// runClocked runs script as root with $1 the host's time when fixClock;
// a non-zero exit is an error quoting its stderr. The host's time is read
// once the SSH connection is up, as the script goes out: read before the
// dial, a busy host's handshake (seconds under TCG) would set the guest
// that far behind.
func (m *Manager) runClocked(ctx context.Context, e state.Entry, script string, fixClock bool) error {
	withTime := func() string {
		if !fixClock {
			return "set --\n" + script
		}
		now := m.Now()
		return "set -- " + fmt.Sprintf("%d.%09d", now.Unix(), now.Nanosecond()) + "\n" + script
	}
	code, _, errOut, err := m.runRoot(ctx, e, withTime)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, termsafe.String(strings.TrimSpace(errOut)))
	}
	return err
}

// runRoot runs a shell script as root in the guest (dev has passwordless
// sudo); script is called once connected.
func (m *Manager) runRoot(ctx context.Context, e state.Entry, script func() string) (code int, stdout, stderr string, err error) {
	c, err := m.dialGuest(ctx, e.Record, e.Layout)
	if err != nil {
		return -1, "", "", err
	}
	defer c.Close()
	var out, errOut bytes.Buffer
	code, err = sshx.Run(ctx, c, "sudo -n sh -s", strings.NewReader(script()), &out, &errOut)
	return code, out.String(), errOut.String(), err
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
	target := sshTarget(r, l)
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
	m.startHolder(e) // the held connection ended with the suspend
	attach := m.attachGuest
	if sus.SuspendKeepsShare() {
		attach = m.setGuestClock // the share stayed mounted, agent-mcp running
	}
	if err := attach(wctx, e, true); err != nil {
		return nil, fmt.Errorf("VM %q resumed, but: %w (hint: `agent-vm restart %s` boots it afresh)", r.Branch, err, e.Slug)
	}
	if !waitHealthy(wctx, r.Ports.MCP) {
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

// waitHealthy waits for agent-mcp's /health on port to answer 200, until
// ctx ends (false).
func waitHealthy(ctx context.Context, port int) bool {
	for b := 250 * time.Millisecond; ; b = min(2*b, 2*time.Second) {
		if h := checkHealth(ctx, port); h.State == "healthy" {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(b):
		}
	}
}

// restoredWait bounds the wait for a guest restored from a saved state
// (the user's timeout, else base stretched by the host's load: bootWait)
// and ends it when its QEMU exits; done releases it.
func (m *Manager) restoredWait(ctx context.Context, slug string, timeout, base time.Duration, d driver.Driver, mach driver.Machine, launch *driver.Launch) (wctx context.Context, done func()) {
	wctx, cancel := m.bootWait(ctx, slug, timeout, base)
	wctx, stopWatch := m.watchQEMU(wctx, d, mach, launch)
	return wctx, func() { stopWatch(); cancel() }
}
