package vm

import (
	"fmt"
	"os"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/state"
)

// The network policy and its commands are internal/netpolicy's; a start
// hands the driver the network below.

// network is the contained network of a start: the proxy's policy written,
// the doors of the exposed ports, and this agent-vm binary as proxy and
// relay.
func (m *Manager) network(r *state.Record, l state.Layout) (*driver.Network, error) {
	if err := netpolicy.Write(l, r); err != nil {
		return nil, err
	}
	exe := m.Executable
	if exe == nil {
		exe = os.Executable
	}
	self, err := exe()
	if err != nil {
		return nil, fmt.Errorf("finding the agent-vm binary for the egress proxy: %w", err)
	}
	dir := netpolicy.DirOf(l)
	return &driver.Network{Addr: guest.HostAddr, ProxyPort: guest.ProxyPort, Exposed: netpolicy.Policy(r).Exposed, Dir: dir,
		Proxy: []string{self, "net-proxy", "--dir", dir},
		Relay: []string{self, "net-relay"}}, nil
}

// Contains reports whether r's VM runs contained: its driver contains
// the network (a driver.NetworkContainer) and the guest is agent-vm's (a
// foreign guest, the repository's own Vagrantfile, is on the networks
// that file sets up). A VM whose driver this build lacks is taken as
// contained (nothing else is said of it).
func (m *Manager) Contains(r *state.Record) bool {
	d, err := m.driverOf(r)
	if err != nil {
		return true
	}
	return contains(d, r)
}

// contains: d contains the network of r's VM.
func contains(d driver.Driver, r *state.Record) bool {
	_, ok := d.(driver.NetworkContainer)
	return ok && r.Guest.Foreign == ""
}
