package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/state"
)

// The network policy and its commands are internal/netpolicy's; a start
// hands the driver the network below.

// network is the contained network of a start: the proxy's policy written,
// the exposed ports, and this agent-vm binary as proxy and
// relay.
func (m *Manager) network(r *state.Record, l state.Layout) (*driver.Network, error) {
	pins, err := m.Pins()
	if err != nil {
		return nil, err
	}
	if err := netpolicy.Write(l, r, pins); err != nil {
		return nil, err
	}
	self, err := m.executable()
	if err != nil {
		return nil, fmt.Errorf("finding the agent-vm binary for the egress proxy: %w", err)
	}
	dir := netpolicy.DirOf(l)
	return &driver.Network{Addr: guest.HostAddr, ProxyPort: guest.ProxyPort, Exposed: netpolicy.Policy(r, pins).Exposed, Dir: dir,
		Proxy: []string{self, "__net-proxy", "--dir", dir},
		Relay: []string{self, "__net-relay"}}, nil
}

// Pins implements netpolicy.PinSource: the host's pins (internal/pins),
// which every VM's policy carries.
func (m *Manager) Pins() ([]egress.Pin, error) { return m.Host.Pins.Read() }

// PinSources is setup's pins step (hostsetup.Pin, record: not --no-pins);
// when the pins change, the running VMs' proxies get them at once
// (netpolicy.Refresh), and refreshed names those VMs.
func (m *Manager) PinSources(ctx context.Context, record bool) (rep hostsetup.PinReport, refreshed []string, err error) {
	rep, err = m.Host.Pin(ctx, record)
	if err != nil || !rep.Changed() {
		return rep, nil, err
	}
	es, err := m.List(ctx)
	if err != nil {
		return rep, nil, err
	}
	refreshed, err = netpolicy.Refresh(ctx, m, es)
	return rep, refreshed, err
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
	return m.contains(d, r)
}

// contains: d contains the network of r's VM.
func (m *Manager) contains(d driver.Driver, r *state.Record) bool {
	_, ok := d.(driver.NetworkContainer)
	_, foreign := m.Foreign(r)
	return ok && !foreign
}

// Publish implements netpolicy.VMs: a VM placed on another host gets its
// policy file copied into its proxy's directory there (atomically, given
// to the proxy's user), which the proxy re-reads as it changes.
func (m *Manager) Publish(ctx context.Context, e state.Entry) error {
	s, err := m.siteOf(e)
	if err != nil || s == nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(netpolicy.DirOf(e.Layout), egress.PolicyFile))
	if err != nil {
		return err
	}
	return s.PutPolicy(ctx, b, e.Record.Guest.UID, e.Record.Guest.GID)
}

// PullLog implements netpolicy.VMs: for a VM placed on another host, its
// proxy's log there is copied over the local one (which nothing else
// writes), and with follow what the host's log gains is appended to it
// (tail -F there) until stop.
func (m *Manager) PullLog(ctx context.Context, e state.Entry, follow bool) (func(), error) {
	s, err := m.siteOf(e)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return func() {}, nil
	}
	return s.PullLog(ctx, netpolicy.LogPath(e.Layout), follow)
}
