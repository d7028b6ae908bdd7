// Package boot waits for a machine its driver has launched (a cold boot,
// a clone of a template, a resume) to be ready: the guest's SSH answering
// with the VM's pinned host key, then agent-mcp's health, then the
// guest's own setup for as long as it makes progress.
//
// A wait's deadline is the user's --timeout, else a base for the kind of
// start stretched by the host's load (package hostload: clamp((load1 +
// other VMs booting) / cores, 1, 4), re-read every loadEvery), and the
// machine's QEMU exiting ends it at once. A wait that fails is an *Error
// with the guest's console's last lines and what cut the wait short.
//
// What a start does to the guest once SSH answers (the backend's setup
// script, the holder, the workspace) is vm's: boot knows the machine, its
// driver and the guest's ports, not the VM's record.
package boot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/hostload"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// The waits' bases on an idle host (see the package doc): a cold boot's
// to agent-mcp healthy under KVM and under TCG, a resume's from the saved
// state to SSH, a clone's from the template's state to agent-mcp healthy
// (restore, then the VM's identity and workspace).
const (
	Cold        = 5 * time.Minute
	ColdTCG     = 15 * time.Minute
	Resume      = 2 * time.Minute
	Clone       = 5 * time.Minute
	loadEvery   = 20 * time.Second
	SettleStall = 10 * time.Minute
)

// ColdFor is a cold boot's base under accelerator acc.
func ColdFor(acc string) time.Duration {
	if acc == accel.TCG {
		return ColdTCG
	}
	return Cold
}

// ToolTimeout is the wait given to a driver whose own tool waits for the
// guest (vagrant up's boot_timeout): the user's timeout, else base
// stretched by the host's load average now, since the tool cannot re-read
// it. Every start computes it, so it reads only /proc/loadavg: counting
// the VMs still booting would ask every VM's driver (a vagrant status
// each).
func ToolTimeout(timeout, base time.Duration) time.Duration {
	if timeout > 0 {
		return timeout
	}
	return hostload.Read(0).Scale(base)
}

// Machine is a launched machine whose guest a start waits for.
type Machine struct {
	VM      string // the branch, as messages name the VM
	Slug    string // as hints name it
	Driver  driver.Driver
	Machine driver.Machine
	Launch  *driver.Launch
	// Target is the guest's SSH with the VM's pinned keys.
	Target  sshx.Target
	MCPPort int
	// Timeout is the user's --timeout; 0 stretches the base by the
	// host's load.
	Timeout time.Duration
	// Booting counts the other VMs on this host whose start has not seen
	// SSH answer yet (their vCPUs are about to add to the load).
	Booting func(ctx context.Context) int
	Report  backend.Reporter
	Log     hclog.Logger
	// Began is when the start began to bring the machine up (the
	// driver's restore, say), which the wait's times count from; zero:
	// when the wait begins.
	Began time.Time
}

// Wait is a wait under way (Machine.Begin).
type Wait struct {
	m      Machine
	ctx    context.Context
	outer  context.Context
	began  time.Time
	logs   driver.Logs
	cancel func()
}

var errQEMUGone = errors.New("QEMU exited during boot")

// Begin starts the wait for m's guest with base as its deadline's base
// (see the package doc); ctx is the caller's, whose end interrupts it.
// Done releases it.
func (m Machine) Begin(ctx context.Context, base time.Duration) *Wait {
	var wctx context.Context
	var cancelWait context.CancelFunc
	if m.Timeout > 0 {
		wctx, cancelWait = context.WithTimeout(ctx, m.Timeout)
	} else {
		wctx, cancelWait = hostload.Stretch(ctx, base, loadEvery, func() hostload.Load { return m.load(ctx) })
	}
	wctx, gone := context.WithCancelCause(wctx)
	done := make(chan struct{})
	go func() { // a QEMU that exits ends the wait at once, not at the deadline
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-wctx.Done():
				return
			case <-t.C:
				if !m.Driver.Running(m.Machine, m.Launch) {
					gone(errQEMUGone)
					return
				}
			}
		}
	}()
	began := m.Began
	if began.IsZero() {
		began = time.Now()
	}
	return &Wait{m: m, ctx: wctx, outer: ctx, began: began, logs: m.Driver.Logs(m.Machine),
		cancel: func() { close(done); gone(nil); cancelWait() }}
}

// load is the host's load, counting the other VMs still booting.
func (m Machine) load(ctx context.Context) hostload.Load {
	n := 0
	if m.Booting != nil {
		n = m.Booting(ctx)
	}
	return hostload.Read(n)
}

// Context is the wait's: it ends at the deadline, when QEMU exits, or
// with the caller's.
func (w *Wait) Context() context.Context { return w.ctx }

// Since is how long the wait has run.
func (w *Wait) Since() time.Duration { return time.Since(w.began) }

// Done releases the wait.
func (w *Wait) Done() { w.cancel() }

// Reporter reports phase with the wait's elapsed time.
func (w *Wait) Reporter(phase string) func(last string) {
	return func(last string) { w.m.Report.Report(phase, w.Since(), last) }
}

// As waits for the guest's SSH to answer with another VM's keys (other:
// that VM's directory, or one laid out as it with its client key and host
// public key) and runs script as root, returning what it printed: a guest
// that is still that VM (a template's clone, restored; a fork's first boot
// of a copy of that VM's disk) is made this one by script. known is a
// known_hosts file written for the wait and removed after. A guest that
// answers with a host key other than that VM's fails with
// sshx.ErrHostKeyMismatch at once: it is not that VM (or something else
// holds the port).
func (w *Wait) As(other state.Layout, known, script string) (string, error) {
	m := w.m
	const phase = "giving the guest its identity"
	_, port, _ := net.SplitHostPort(m.Target.Addr)
	p, _ := strconv.Atoi(port)
	if err := other.PinHostKey(known, p); err != nil {
		return "", w.Fail(phase, err)
	}
	defer os.Remove(known)
	t := m.Target
	t.KeyFile, t.KnownHosts = other.ClientKey(), known
	c, err := sshx.WaitReady(w.ctx, t, w.progress)
	if err != nil {
		if w.outer.Err() != nil {
			return "", w.outer.Err()
		}
		return "", w.Fail("waiting for SSH as the VM it was made from", err)
	}
	defer c.Close()
	m.Log.Debug("ssh answers as the VM it was made from", "after", w.Since())
	var stdout, stderr strings.Builder
	code, err := sshx.Run(w.ctx, c, guest.RootShell, strings.NewReader(script), &stdout, &stderr)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		return "", w.Fail(phase, err)
	}
	return stdout.String(), nil
}

// progress reports the wait for SSH with the console's last line.
func (w *Wait) progress(elapsed time.Duration, _ error) {
	w.m.Report.Report("waiting for SSH", elapsed, lastLine(w.tail(1)))
}

// SSH waits for the guest's SSH to answer with the VM's pinned keys,
// reporting the console's last line meanwhile, and records that the
// machine is up (the driver's MarkReady: status stops calling it
// starting, and other starts stop counting it as booting). The client is
// the caller's to close. The caller's ctx ending returns its error as is:
// the caller undoes the start.
func (w *Wait) SSH(phase string) (*ssh.Client, time.Duration, error) {
	m := w.m
	c, err := sshx.WaitReady(w.ctx, m.Target, w.progress)
	if err != nil {
		if w.outer.Err() != nil {
			return nil, 0, w.outer.Err()
		}
		if errors.Is(err, sshx.ErrHostKeyMismatch) {
			// Not this VM's sshd: its SSH port is held by something else
			// (another VM's forward, say) that answered instead.
			_, port, _ := net.SplitHostPort(m.Target.Addr)
			err = fmt.Errorf("the VM's SSH port %s is held by another program (it answered with a host key other than %s's), so agent-vm did not connect (hint: stop that program, which `ss -ltnp 'sport = :%s'` shows, then `agent-vm stop %s` and `agent-vm start %s`): %w",
				port, m.Slug, port, m.Slug, m.Slug, err)
		}
		return nil, 0, w.Fail(phase, err)
	}
	ready := w.Since()
	if err := m.Driver.MarkReady(m.Machine, time.Now()); err != nil {
		m.Log.Warn("could not record that the VM is up", "error", err)
	}
	m.Log.Debug("ssh ready", "after", ready) // bench reads it
	return c, ready, nil
}

// Ready readies the guest as r says (guestctl.Ready) within the wait's
// deadline. Its one root session reports nothing while it runs, so its
// phase is told as it begins: a start that hangs in it says where. The
// start's setup failing is warned of here, and not Ready's error: the VM
// works, its secrets do not.
func (w *Wait) Ready(root guestctl.Root, r guestctl.Readying) (guestctl.Readied, error) {
	if !r.Empty() {
		w.Reporter("setting up the guest for this start")("")
	}
	rd, err := guestctl.Ready(w.ctx, root, r)
	if rd.SetupErr != nil {
		w.m.Log.Warn("the guest did not take the VM's CA and the placeholders of its secrets, so requests that need them fail (hint: `agent-vm stop "+w.m.Slug+"`, then start it again)", "vm", w.m.VM, "error", rd.SetupErr)
	}
	return rd, err
}

// healthPolls are the waits between two looks at agent-mcp's /health:
// short, since a look is cheap (a refused connection while agent-mcp is
// not listening yet) and a start waits on it, growing to at most half a
// second for a long wait. agent-mcp listens a few seconds after the
// workspace is mounted; steps growing to 2 s found it up to 2 s late.
const healthPollFirst, healthPollMax = 100 * time.Millisecond, 500 * time.Millisecond

// Health waits for agent-mcp's /health to answer 200, reporting its
// answer meanwhile; it returns how long the wait had run then.
func (w *Wait) Health() (time.Duration, error) {
	m := w.m
	for b := healthPollFirst; ; b = min(b*3/2, healthPollMax) {
		h := guestctl.CheckHealth(w.ctx, m.MCPPort)
		if h.State == "healthy" {
			return w.Since(), nil
		}
		m.Report.Report("waiting for agent-mcp", w.Since(), h.Detail)
		select {
		case <-w.ctx.Done():
			if err := w.outer.Err(); err != nil {
				return 0, err
			}
			return 0, w.Fail("waiting for agent-mcp /health", fmt.Errorf("%s after %s (hint: `agent-vm logs %s` shows agent-mcp's journal)", termsafe.String(h.Detail), w.Since().Truncate(time.Second), m.Slug))
		case <-time.After(b):
		}
	}
}

// Fail is the wait's failure in phase: err with what cut the wait short
// (QEMU's exit, the load-stretched deadline, --timeout) and the console's
// last lines.
func (w *Wait) Fail(phase string, err error) *Error {
	m := w.m
	var late *hostload.TimeoutError
	switch cause := context.Cause(w.ctx); {
	case errors.Is(cause, errQEMUGone):
		phase, err = "booting", fmt.Errorf("%w; QEMU's log %s says: %s", errQEMUGone, w.logs.Driver, w.tailOf(w.logs.Driver, 3))
	case errors.As(cause, &late):
		err = fmt.Errorf("%w: %v (hint: start fewer VMs at once, or give start a longer --timeout)", err, late)
	case errors.Is(cause, context.DeadlineExceeded):
		err = fmt.Errorf("%w: --timeout %s ran out (the host: %s)", err, m.Timeout, m.load(w.outer))
	}
	return &Error{VM: m.VM, Phase: phase, Err: err, ConsoleLog: w.logs.Console, Tail: w.tail(15)}
}

// Settle waits for the guest's own setup (guestctl.Settle over c) while
// it makes progress, reporting its log's last line; it stalls after
// SettleStall without. It has no deadline: on a busy host the packages,
// the agent CLI and provisioning take as long as they take.
func (w *Wait) Settle(ctx context.Context, c *ssh.Client, s guestctl.Settling) error {
	s.Stall, s.Every, s.Report = SettleStall, 10*time.Second, w.Reporter("finishing the guest's setup")
	s.Report("")
	return guestctl.Settle(ctx, c, s)
}

// tail is the console's last n lines.
func (w *Wait) tail(n int) string { return w.tailOf(w.logs.Console, n) }

// tailOf is the last n lines of the machine's log at path when it lies on
// this machine; "" for a machine placed on another host, whose logs are
// there (`agent-vm logs` reads them over the link).
func (w *Wait) tailOf(path string, n int) string {
	if w.m.Machine.Remote != nil {
		return ""
	}
	return driver.TailFile(path, n)
}

// lastLine is the console's latest line, for progress lines: escaped,
// without colours, at most 120 characters.
func lastLine(last string) string {
	line := []rune(strings.TrimSpace(termsafe.Line(last)))
	if len(line) > 120 {
		return string(line[:120]) + "…"
	}
	return string(line)
}

// Error is a guest that did not become ready. The VM is left running so
// it can be inspected, unless Stopped.
type Error struct {
	VM         string
	Phase      string
	Err        error
	ConsoleLog string
	Tail       string
	Stopped    bool
}

func (e *Error) Error() string {
	hint := fmt.Sprintf("the VM is still running: `agent-vm logs %s` shows more, `agent-vm stop %s` stops it", e.VM, e.VM)
	if e.Stopped {
		hint = fmt.Sprintf("the VM was stopped; `agent-vm logs %s` shows more", e.VM)
	}
	return fmt.Sprintf("%s: %s: %v\nlast lines of the serial console (%s):\n%s\n(hint: %s)",
		e.VM, e.Phase, e.Err, e.ConsoleLog, termsafe.Indent(e.Tail), hint)
}

func (e *Error) Unwrap() error { return e.Err }
