package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/boot"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guestconn"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
)

// The wait for a launched guest is package boot's; what a start does to
// the guest on the way (its setup script, the holder, the workspace) is
// here.

// bootOf is the machine a start, clone or resume of e launched, as boot
// waits for it.
func (m *Manager) bootOf(e state.Entry, d driver.Driver, mach driver.Machine, launch *driver.Launch, o StartOptions) boot.Machine {
	r := e.Record
	return boot.Machine{VM: r.Branch, Slug: r.Slug, Driver: d, Machine: mach, Launch: launch, Target: m.guestOf(r, e.Layout).Target(),
		MCPPort: r.Ports.MCP, Timeout: o.Timeout, Report: o.Report, Log: m.Log,
		Booting: func(ctx context.Context) int { return m.bootingOthers(ctx, r.Slug) }}
}

// waitReady waits for a cold boot's guest: SSH with the pinned key (on a
// fork's first start, the keys of the VM its disk was copied from first:
// backend.Plan.Adopt), then the backend's setup script and the holder,
// agent-mcp's health, the backend's settle command.
func (m *Manager) waitReady(ctx context.Context, e state.Entry, d driver.Driver, mach driver.Machine, launch *driver.Launch, o StartOptions, plan *backend.Plan, res *StartResult) error {
	w := m.bootOf(e, d, mach, launch, o).Begin(ctx, boot.ColdFor(launch.Accel))
	defer w.Done()
	if a := plan.Adopt; a != nil { // a guest with a key of its own is not the source's: provisioned as this VM, say
		_, err := w.As(state.Layout{Dir: a.Keys}, e.Layout.Run("adopt_known_hosts"), a.Personalize)
		if os.RemoveAll(a.Keys); err != nil && !errors.Is(err, sshx.ErrHostKeyMismatch) {
			if be := (*boot.Error)(nil); errors.As(err, &be) {
				be.Err = fmt.Errorf("%w (its next start, after a stop, provisions the copied disk as this VM)", be.Err)
			}
			return err
		}
	}
	c, ready, err := w.SSH("waiting for SSH")
	if err != nil {
		return err
	}
	res.SSHReady = ready
	// The setup on the connection that answered: no other handshake.
	w.Ready(guestconn.RootOn(c), guestctl.Readying{Setup: plan.Setup}) // a failure is warned of
	c.Close()
	m.startHolder(e)
	if res.HealthReady, err = w.Health(); err != nil {
		return err
	}
	if plan.Settle != "" {
		c, err := m.dialGuest(ctx, e.Record, e.Layout)
		if err == nil {
			err = w.Settle(ctx, c, guestctl.Settling{Command: plan.Settle, Log: plan.SetupLog})
			c.Close()
		}
		m.settled(ctx, e.Record, err, "; wait for the setup with `agent-vm exec "+e.Record.Branch+" -- cloud-init status --wait`")
	}
	return ctx.Err() // interrupted while settling: the caller stops the VM
}

// settled warns of a first-boot setup that did not finish (boot's
// Settle): not a failed start, since the VM is up and healthy; more
// names another way to wait for it.
func (m *Manager) settled(ctx context.Context, r *state.Record, err error, more string) {
	var stall *guestctl.StallError
	switch {
	case err == nil, ctx.Err() != nil:
	case errors.As(err, &stall):
		m.Log.Warn("the VM is up, but its first-boot setup (packages, agent CLI, provisioning) stopped making progress; it may go on in the guest, and if the VM is stopped before it ends, its next boot may set it up again (hint: `agent-vm logs "+r.Branch+"` shows the guest's log"+more+")", "error", err)
	default:
		m.Log.Warn("the VM is up, but its first-boot setup (packages, agent CLI, provisioning) did not finish; if the VM is stopped soon, its next boot may set it up again", "vm", r.Branch, "error", execx.TailLines(strings.TrimSpace(err.Error()), 5))
	}
}

// restoredHealth waits for agent-mcp in a guest restored from a saved
// state (a resume, a clone), whose start does not fail for it: the guest
// came back, and agent-mcp may follow (res.HealthReady stays 0).
func (m *Manager) restoredHealth(ctx context.Context, w *boot.Wait, e state.Entry, res *StartResult, how string) error {
	var err error
	if res.HealthReady, err = w.Health(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		m.Log.Warn("the VM "+how+", but agent-mcp does not answer yet", "vm", e.Record.Branch, "error", err)
	}
	return nil
}

// bootingOthers counts this state directory's VMs, other than self, whose
// machine runs and whose start has not seen SSH answer yet.
func (m *Manager) bootingOthers(ctx context.Context, self string) int {
	entries, err := m.Root.List()
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if e.Record == nil || e.Slug == self {
			continue
		}
		d, err := m.driverOf(e.Record)
		if err != nil {
			continue
		}
		live, err := d.Inspect(ctx, m.machine(e.Record, e.Layout))
		if err == nil && live.State == driver.StateRunning && live.Launch != nil && live.Launch.ReadyAt == nil {
			n++
		}
	}
	return n
}
