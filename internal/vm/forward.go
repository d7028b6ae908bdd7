package vm

import (
	"context"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/portbook"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Book is the book of the host ports the VMs of Root and of this user's
// other state directories hold (internal/forward, `agent-vm port`, asks
// for it and for Live).
func (m *Manager) Book() *portbook.Book {
	return &portbook.Book{Root: m.Root, Registry: m.Registry, Free: m.PortFree, Log: m.Log}
}

// Live is the VM's driver and machine, and whether its machine's process
// runs (also paused in place: its network, and so its forwards, run on).
func (m *Manager) Live(ctx context.Context, e state.Entry) (driver.Driver, driver.Machine, bool, error) {
	d, mach, live, err := m.Inspect(ctx, e)
	return d, mach, live.HasProcess(), err
}

// rebind moves the ports agent-vm picked that another program took while
// the VM was stopped (portbook.Book.Rebind), before a boot or a resume
// from a saved state; paused in place, its process holds them.
func (m *Manager) rebind(ctx context.Context, e state.Entry, mach *driver.Machine, live driver.Live) error {
	if live.HasProcess() {
		return nil
	}
	err := m.Book().Rebind(ctx, e.Record, e.Layout)
	mach.Forwards = backend.MachineOf(e.Record, e.Layout).Forwards
	return err
}
