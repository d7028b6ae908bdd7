package vm

import (
	"context"
	"time"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/hostload"
)

// Boot timeouts scale with the host's load (package hostload): a start's
// default wait for SSH and agent-mcp is bootBase under KVM or bootBaseTCG
// under TCG on an idle host, stretched by
// clamp((load1 + other VMs booting) / cores, 1, 4), re-read every
// loadEvery while it waits; a resume's is resumeBase, a first start from
// a template's cloneBase (restore, then the VM's identity and workspace). A --timeout the user gives is kept as it is.
const (
	bootBase    = 5 * time.Minute
	bootBaseTCG = 15 * time.Minute
	resumeBase  = 2 * time.Minute // from a saved state to SSH-ready
	cloneBase   = 5 * time.Minute // from a template to agent-mcp healthy
	loadEvery   = 20 * time.Second
)

// hostLoad reads the host's load, counting the VMs of this state
// directory other than self that run and have not answered yet.
func (m *Manager) hostLoad(ctx context.Context, self string) hostload.Load {
	return hostload.Read(m.bootingOthers(ctx, self))
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

// bootBaseFor is a start's base wait under accelerator acc.
func bootBaseFor(acc string) time.Duration {
	if acc == accel.TCG {
		return bootBaseTCG
	}
	return bootBase
}

// toolBootTimeout is the wait given to a driver whose own tool waits for
// the guest (vagrant up's boot_timeout): the user's timeout, else base
// stretched by the host's load average now, since the tool cannot re-read
// it. Every start computes it, so it reads only /proc/loadavg: counting
// the VMs still booting would ask every VM's driver (a vagrant status
// each).
func toolBootTimeout(timeout, base time.Duration) time.Duration {
	if timeout > 0 {
		return timeout
	}
	return hostload.Read(0).Scale(base)
}

// bootWait is the context a start waits for the guest in: timeout when
// the user gave one, else the base for the accelerator stretched by the
// host's load.
func (m *Manager) bootWait(ctx context.Context, slug string, timeout, base time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(ctx, timeout)
	}
	return hostload.Stretch(ctx, base, loadEvery, func() hostload.Load { return m.hostLoad(ctx, slug) })
}
