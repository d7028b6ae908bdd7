package vm

import (
	"context"
	"fmt"
	"slices"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/state"
)

// PortChange is what `port add` or `port rm` did.
type PortChange struct {
	Branch  string
	Slug    string
	Forward state.Forward
	// Live: the running VM's forwards changed now; otherwise the VM is
	// stopped and the change takes effect at its next start.
	Live bool
	// Unchanged: add found the forward already there, and did nothing.
	Unchanged bool
}

// PortAdd forwards guestPort of the VM name means to 127.0.0.1:hostPort on
// the host, at once when the VM runs, and keeps the forward in the record
// so every start applies it. hostPort 0 picks one: the guest port's own
// number when it is free, else a free port of ports.ForwardRange.
//
// Adding a forward that is already there (the same guest port, to the same
// host port or with none given) changes nothing and is no error: a script
// that starts a dev server can ask for its port every time. The same guest
// port to another host port is an error, since a guest port has one
// forward.
func (m *Manager) PortAdd(ctx context.Context, name string, guestPort, hostPort int) (*PortChange, error) {
	if err := checkGuestPort(guestPort); err != nil {
		return nil, err
	}
	if hostPort != 0 && (hostPort < 1 || hostPort > 65535) {
		return nil, fmt.Errorf("HOST_PORT %d is not a port number (hint: use 1024 to 65535, or leave it out to get a free one)", hostPort)
	}
	e, lock, err := m.lockedEntry(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	r := e.Record
	if err := checkNotEndpoint(r, guestPort); err != nil {
		return nil, err
	}
	ch := &PortChange{Branch: r.Branch, Slug: r.Slug}
	if i := forwardOf(r, guestPort); i >= 0 {
		f := r.Forwards[i]
		if hostPort != 0 && hostPort != f.Host {
			return nil, fmt.Errorf("guest port %d of %q is already forwarded to host port %d (hint: `agent-vm port rm %s %d` first to forward it to another port)", guestPort, r.Branch, f.Host, r.Slug, guestPort)
		}
		ch.Forward, ch.Unchanged = f, true
		return ch, nil
	}
	// The ports lock, as create takes it (after the VM's): nobody else
	// may pick this host port before the record holds it.
	release, err := m.lockPorts(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	if ch.Forward.Host, err = m.pickHostPort(guestPort, hostPort); err != nil {
		return nil, err
	}
	ch.Forward.Guest = guestPort
	d, mach, running, err := m.liveMachine(ctx, e)
	if err != nil {
		return nil, err
	}
	if running {
		if err := addForward(ctx, d, mach, backend.UserForward(ch.Forward)); err != nil {
			return nil, fmt.Errorf("forwarding guest port %d of %q: %w", guestPort, r.Branch, err)
		}
		ch.Live = true
	}
	r.Forwards = append(r.Forwards, ch.Forward)
	if err := state.WriteRecord(e.Layout.Record(), r); err != nil {
		if running {
			_ = removeForward(ctx, d, mach, backend.UserForward(ch.Forward))
		}
		return nil, err
	}
	m.Log.Info("port forwarded", "vm", r.Slug, "guest", guestPort, "host", ch.Forward.Host, "live", ch.Live)
	return ch, nil
}

// PortRemove ends the forward of guestPort: at once when the VM runs, and
// in the record. A forward the VM does not have is an error.
func (m *Manager) PortRemove(ctx context.Context, name string, guestPort int) (*PortChange, error) {
	if err := checkGuestPort(guestPort); err != nil {
		return nil, err
	}
	e, lock, err := m.lockedEntry(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	r := e.Record
	i := forwardOf(r, guestPort)
	if i < 0 {
		if err := checkNotEndpoint(r, guestPort); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%q has no forward of guest port %d (hint: `agent-vm port list %s` shows its forwards)", r.Branch, guestPort, r.Slug)
	}
	ch := &PortChange{Branch: r.Branch, Slug: r.Slug, Forward: r.Forwards[i]}
	d, mach, running, err := m.liveMachine(ctx, e)
	if err != nil {
		return nil, err
	}
	if running {
		if err := removeForward(ctx, d, mach, backend.UserForward(ch.Forward)); err != nil {
			return nil, fmt.Errorf("ending the forward of guest port %d of %q: %w", guestPort, r.Branch, err)
		}
		ch.Live = true
	}
	r.Forwards = slices.Delete(r.Forwards, i, i+1)
	if err := state.WriteRecord(e.Layout.Record(), r); err != nil {
		return nil, err
	}
	m.Log.Info("port forward removed", "vm", r.Slug, "guest", guestPort, "host", ch.Forward.Host, "live", ch.Live)
	return ch, nil
}

// PortList is `port list`: the VM's own forwards, in the order they were
// added, and whether the VM runs (they are live) or not.
func (m *Manager) PortList(ctx context.Context, name string) ([]state.Forward, bool, error) {
	e, err := m.findRecorded(ctx, name)
	if err != nil {
		return nil, false, err
	}
	_, _, running, err := m.liveMachine(ctx, e)
	if err != nil {
		return nil, false, err
	}
	return forwardsOf(e.Record), running, nil
}

// forwardsOf is the record's forwards, never nil (JSON prints []).
func forwardsOf(r *state.Record) []state.Forward {
	if r.Forwards == nil {
		return []state.Forward{}
	}
	return r.Forwards
}

// addForward adds f to the running machine mach, or refuses when its
// driver cannot (it is no driver.Forwarder: its machines' forwards are
// what Start applied).
func addForward(ctx context.Context, d driver.Driver, mach driver.Machine, f driver.Forward) error {
	fw, ok := d.(driver.Forwarder)
	if !ok {
		return fmt.Errorf("forwarding host port %d to guest port %d of %s: the %s driver forwards only the VM's SSH and MCP ports (hint: reach other guest ports over SSH, `ssh -L` with `agent-vm ssh-config`): %w", f.Host, f.Guest, mach.Name, d.Name(), driver.ErrUnsupported)
	}
	return fw.AddForward(ctx, mach, f)
}

// removeForward ends the forward f of the running machine mach, or
// refuses when its driver cannot (see addForward).
func removeForward(ctx context.Context, d driver.Driver, mach driver.Machine, f driver.Forward) error {
	fw, ok := d.(driver.Forwarder)
	if !ok {
		return fmt.Errorf("removing the forward of host port %d of %s: the %s driver has no forwards besides SSH and MCP: %w", f.Host, mach.Name, d.Name(), driver.ErrUnsupported)
	}
	return fw.RemoveForward(ctx, mach, f)
}

// liveMachine is the VM's driver and machine, and whether it runs.
func (m *Manager) liveMachine(ctx context.Context, e state.Entry) (driver.Driver, driver.Machine, bool, error) {
	d, err := m.driverOf(e.Record)
	if err != nil {
		return nil, driver.Machine{}, false, err
	}
	mach := m.machine(e.Record, e.Layout)
	live, err := d.Inspect(ctx, mach)
	if err != nil {
		return nil, driver.Machine{}, false, err
	}
	return d, mach, live.Alive(), nil
}

// pickHostPort chooses the host port of a new forward of guestPort; the
// caller holds the ports lock.
func (m *Manager) pickHostPort(guestPort, hostPort int) (int, error) {
	taken, err := m.takenPorts()
	if err != nil {
		return 0, err
	}
	if hostPort != 0 {
		if err := ports.CheckAs(hostPort, "HOST_PORT", taken, m.PortFree); err != nil {
			return 0, err
		}
		return hostPort, nil
	}
	if _, ok := taken[guestPort]; !ok && guestPort >= 1024 && m.PortFree(guestPort) {
		return guestPort, nil
	}
	return ports.Pick(ports.ForwardRange(), taken, m.PortFree)
}

// forwardOf is the index of the record's forward of guestPort, or -1.
func forwardOf(r *state.Record, guestPort int) int {
	return slices.IndexFunc(r.Forwards, func(f state.Forward) bool { return f.Guest == guestPort })
}

// checkGuestPort refuses what is not a TCP port number.
func checkGuestPort(p int) error {
	if p < 1 || p > 65535 {
		return fmt.Errorf("GUEST_PORT %d is not a port number (hint: use 1 to 65535)", p)
	}
	return nil
}

// checkNotEndpoint refuses the guest ports of SSH and agent-mcp, which
// every VM forwards on host ports of its own.
func checkNotEndpoint(r *state.Record, guestPort int) error {
	switch guestPort {
	case guest.SSHPort:
		return fmt.Errorf("guest port %d is SSH's, which %q forwards already, on host port %d (hint: `agent-vm shell %s`, or ssh after `agent-vm ssh-config`)", guestPort, r.Branch, r.Ports.SSH, r.Slug)
	case guest.MCPPort:
		return fmt.Errorf("guest port %d is agent-mcp's, which %q forwards already, on host port %d (hint: `agent-vm mcp-config %s` prints its client entry; serve your own program on another guest port)", guestPort, r.Branch, r.Ports.MCP, r.Slug)
	}
	return nil
}
