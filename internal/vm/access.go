package vm

import (
	"context"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/fork"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/template"
)

// What the rooms that act on a VM themselves (the network policy, MCP
// sync, agent sessions, the templates' commands) ask of the Manager, each
// through a small interface of its own that the Manager satisfies.

var (
	_ fork.VMs         = (*Manager)(nil)
	_ template.VMs     = (*Manager)(nil)
	_ template.Builder = templateVMs{}
)

// TryLockVM takes the lock of the VM called slug unless another process
// holds it (ok false); the caller releases it.
func (m *Manager) TryLockVM(slug string) (*state.Lock, bool, error) {
	return m.Root.TryLockVM(slug)
}

// LockVM takes the lock of the VM called slug; the caller releases it.
func (m *Manager) LockVM(ctx context.Context, slug string) (*state.Lock, error) {
	return m.Root.LockVM(ctx, slug)
}

// State is the VM's state as status shows it (vminfo.StateRunning ...), without
// asking agent-mcp.
func (m *Manager) State(ctx context.Context, e state.Entry) string {
	return m.Status(ctx, e, false).State
}

// Inspect is the VM's driver, machine and live state, as its driver reads
// it from the host.
func (m *Manager) Inspect(ctx context.Context, e state.Entry) (driver.Driver, driver.Machine, driver.Live, error) {
	d, err := m.driverOf(e.Record)
	if err != nil {
		return nil, driver.Machine{}, driver.Live{}, err
	}
	mach := m.machine(e.Record, e.Layout)
	live, err := d.Inspect(ctx, mach)
	return d, mach, live, err
}
