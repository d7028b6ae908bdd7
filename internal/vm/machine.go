package vm

import (
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hosts"
	"github.com/agent-vm/agent-vm/internal/state"
)

// machine describes a VM to its driver (backend.MachineOf).
func (m *Manager) machine(r *state.Record, l state.Layout) driver.Machine {
	mach := backend.MachineOf(r, l)
	if r != nil && r.Host != "" {
		mach.Remote = m.remoteOf(r.Host)
	}
	return mach
}

// remoteOf is where the driver reaches the registered host name, nil for
// a host that is this machine's libvirtd. A host whose entry or link
// cannot be read still gives a Remote, with no address: the driver then
// refuses to act, naming it, rather than act on this machine.
func (m *Manager) remoteOf(name string) *driver.Remote {
	if m.Hosts == nil {
		return &driver.Remote{Host: name}
	}
	h, err := m.Hosts.Get(name)
	if err != nil {
		m.Log.Warn("cannot read the host a VM is placed on", "host", name, "error", err)
		return &driver.Remote{Host: name}
	}
	if u, err := hosts.ParseURI(h.URI); err == nil && !u.Remote() {
		return nil
	}
	r := &driver.Remote{Host: name, Dir: h.AgentDir()}
	if h.Link != nil {
		r.Addr, r.User, r.KeyFile, r.KnownHosts = h.Link.Addr, h.Link.User, h.Link.KeyFile, h.Link.KnownHosts
	}
	return r
}

// unrecordedMachine describes the VM of a directory whose record is
// unreadable from that directory alone: no uuid, no size, no ports. Enough
// for the driver's Adopt (driver.Adopter) to find it and for Stop to end
// it.
func unrecordedMachine(e state.Entry) driver.Machine {
	l := e.Layout
	return driver.Machine{Name: state.MachineName(e.Slug), RunDir: l.RunDir(), LogsDir: l.LogsDir(),
		Share: driver.Share{Source: l.Workspace(), Tag: guest.ShareTag}}
}
