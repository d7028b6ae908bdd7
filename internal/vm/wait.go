package vm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/hostload"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Waiting for a booting guest: SSH with the pinned key, agent-mcp's
// health, the backend's settle command; a QEMU that exits ends the wait.

// BootError is a boot that did not reach SSH or agent-mcp in time. The VM
// is left running so it can be inspected.
type BootError struct {
	VM         string
	Phase      string
	Err        error
	ConsoleLog string
	Tail       string
}

func (e *BootError) Error() string {
	return fmt.Sprintf("%s: %s: %v\nlast lines of the serial console (%s):\n%s\n(hint: the VM is still running: `agent-vm logs %s` shows more, `agent-vm stop %s` stops it)",
		e.VM, e.Phase, e.Err, e.ConsoleLog, termsafe.Indent(e.Tail), e.VM, e.VM)
}

func (e *BootError) Unwrap() error { return e.Err }

// waitReady waits for SSH with the pinned key, then for agent-mcp's health,
// then runs the backend's settle command.
func (m *Manager) waitReady(ctx context.Context, e state.Entry, d driver.Driver, mach driver.Machine, launch *driver.Launch, o StartOptions, plan *backend.Plan, res *StartResult) error {
	r, l := e.Record, e.Layout
	wctx, cancel := m.bootWait(ctx, r.Slug, o.Timeout, bootBaseFor(launch.Accel))
	defer cancel()
	wctx, stopWatch := m.watchQEMU(wctx, d, mach, launch)
	defer stopWatch()
	began := time.Now()
	logs := d.Logs(mach)
	bootErr := func(phase string, err error) error {
		var late *hostload.TimeoutError
		switch cause := context.Cause(wctx); {
		case errors.Is(cause, errQEMUGone):
			phase, err = "booting", fmt.Errorf("%w; QEMU's log %s says: %s", errQEMUGone, logs.Driver, tailHere(mach, logs.Driver, 3))
		case errors.As(cause, &late):
			err = fmt.Errorf("%w: %v (hint: start fewer VMs at once, or give start a longer --timeout)", err, late)
		case errors.Is(cause, context.DeadlineExceeded):
			err = fmt.Errorf("%w: --timeout %s ran out (the host: %s)", err, o.Timeout, m.hostLoad(ctx, r.Slug))
		}
		return &BootError{VM: r.Branch, Phase: phase, Err: err, ConsoleLog: logs.Console, Tail: tailHere(mach, logs.Console, 15)}
	}
	target := m.guestOf(r, l).Target()
	progress := func(elapsed time.Duration, _ error) {
		o.Report.Report("waiting for SSH", elapsed, lastConsoleLine(tailHere(mach, logs.Console, 1)))
	}
	client, err := sshx.WaitReady(wctx, target, progress)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, sshx.ErrHostKeyMismatch) {
			// Not this VM's sshd: its SSH port is held by something else
			// (another VM's forward, say) that answered instead.
			err = fmt.Errorf("the VM's SSH port %d is held by another program (it answered with a host key other than %s's), so agent-vm did not connect (hint: stop that program, which `ss -ltnp 'sport = :%d'` shows, then `agent-vm stop %s` and `agent-vm start %s`): %w",
				r.Ports.SSH, r.Slug, r.Ports.SSH, r.Slug, r.Slug, err)
		}
		return bootErr("waiting for SSH", err)
	}
	client.Close()
	res.SSHReady = time.Since(began)
	m.guestSetup(wctx, e, plan.Setup)
	m.startHolder(e)
	if err := d.MarkReady(mach, time.Now()); err != nil {
		m.Log.Warn("could not record that the VM is up", "error", err)
	}
	m.Log.Debug("ssh ready", "after", res.SSHReady)

	b := 250 * time.Millisecond
	for {
		h := guestctl.CheckHealth(wctx, r.Ports.MCP)
		if h.State == "healthy" {
			res.HealthReady = time.Since(began)
			// The guest's own setup has no deadline: it goes on while the
			// guest makes progress (guestctl.Settle).
			m.settle(ctx, r, l, plan, func(last string) { o.Report.Report("finishing the guest's setup", time.Since(began), last) })
			return ctx.Err() // interrupted while settling: the caller stops the VM
		}
		o.Report.Report("waiting for agent-mcp", time.Since(began), h.Detail)
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return bootErr("waiting for agent-mcp /health", fmt.Errorf("%s after %s (hint: `agent-vm logs %s` shows agent-mcp's journal)", termsafe.String(h.Detail), time.Since(began).Truncate(time.Second), r.Slug))
		case <-time.After(b):
		}
		if b < 2*time.Second {
			b *= 2
		}
	}
}

// settleStall is how long the guest's first-boot setup may make no
// progress before start stops waiting for it.
const settleStall = 10 * time.Minute

// settle waits for the guest's own setup (backend.Plan.Settle) while it
// makes progress, reporting its log's last line. A failure is a warning,
// not a failed start: the VM is up and healthy.
func (m *Manager) settle(ctx context.Context, r *state.Record, l state.Layout, plan *backend.Plan, report func(last string)) {
	if plan.Settle == "" {
		return
	}
	report("")
	c, err := m.dialGuest(ctx, r, l)
	if err == nil {
		err = guestctl.Settle(ctx, c, guestctl.Settling{Command: plan.Settle, Log: plan.SetupLog, Stall: settleStall, Every: 10 * time.Second, Report: report})
		c.Close()
	}
	var stall *guestctl.StallError
	switch {
	case err == nil, ctx.Err() != nil:
	case errors.As(err, &stall):
		m.Log.Warn("the VM is up, but its first-boot setup (cloud-init: packages, agent CLI, provisioning) stopped making progress; it may go on in the guest, and if the VM is stopped before it ends, its next boot may set it up again (hint: `agent-vm logs "+r.Branch+"` shows the guest's log; wait for the setup with `agent-vm exec "+r.Branch+" -- cloud-init status --wait`)", "error", err)
	default:
		m.Log.Warn("the VM is up, but waiting for its setup to finish failed; if the VM is killed soon, its next boot may set it up again", "command", plan.Settle, "error", err)
	}
}

// guestSetup runs the backend's setup script (backend.Plan.Setup) before
// the held connection and any session begin, so that they see its
// placeholders. A failure is a warning: the VM works, its secrets do not.
func (m *Manager) guestSetup(ctx context.Context, e state.Entry, script string) {
	m.guestSetupWith(ctx, e, m.rootOf(e), script)
}

// guestSetupWith is guestSetup through root (a connection already open).
func (m *Manager) guestSetupWith(ctx context.Context, e state.Entry, root guestctl.Root, script string) {
	if script == "" {
		return
	}
	code, _, stderr, err := root(ctx, func() string { return script })
	if err == nil && code != 0 {
		err = fmt.Errorf("exit status %d: %s", code, execx.TailLines(strings.TrimSpace(stderr), 3))
	}
	if err != nil {
		m.Log.Warn("the guest did not take the VM's CA and the placeholders of its secrets, so requests that need them fail (hint: `agent-vm stop "+e.Slug+"`, then start it again)", "vm", e.Record.Branch, "error", err)
	}
}

var errQEMUGone = errors.New("QEMU exited during boot")

// watchQEMU returns a context that is cancelled with errQEMUGone when the
// VM's QEMU exits (the driver's Running), so a boot that dies ends the wait
// at once instead of at the timeout.
func (m *Manager) watchQEMU(ctx context.Context, d driver.Driver, mach driver.Machine, launch *driver.Launch) (context.Context, func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-wctx.Done():
				return
			case <-t.C:
				if !d.Running(mach, launch) {
					cancel(errQEMUGone)
					return
				}
			}
		}
	}()
	return wctx, func() { close(done); cancel(nil) }
}

// lastConsoleLine is the guest's latest console line (last), for progress
// lines: escaped, without colours, at most 120 characters.
func lastConsoleLine(last string) string {
	line := []rune(strings.TrimSpace(termsafe.Line(last)))
	if len(line) > 120 {
		return string(line[:120]) + "…"
	}
	return string(line)
}

// tailHere is the last n lines of a log of mach's that lies on this
// machine; "" for a machine placed on another host, whose logs are there
// (`agent-vm logs` reads them over the link).
func tailHere(mach driver.Machine, path string, n int) string {
	if mach.Remote != nil {
		return ""
	}
	return driver.TailFile(path, n)
}
