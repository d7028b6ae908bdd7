package vm

import (
	"context"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/portbook"
	"github.com/agent-vm/agent-vm/internal/state"
)

// A VM's own port forwards (`agent-vm port`) are internal/forward's; it
// asks the Manager for the port book and a VM's running machine.

// Book is the book of the host ports the VMs of Root and of this user's
// other state directories hold.
func (m *Manager) Book() *portbook.Book {
	return &portbook.Book{Root: m.Root, Registry: m.Registry, Free: m.PortFree, Log: m.Log}
}

// Live is the VM's driver and machine, and whether its machine's process
// runs (also paused in place: its network, and so its forwards, run on).
func (m *Manager) Live(ctx context.Context, e state.Entry) (driver.Driver, driver.Machine, bool, error) {
	d, mach, live, err := m.Inspect(ctx, e)
	if err != nil {
		return nil, driver.Machine{}, false, err
	}
	return d, mach, live.HasProcess(), nil
}
