// Package forward is a VM's own port forwards, `agent-vm port add|rm|list`:
// a guest port on a host port of 127.0.0.1, kept in the VM's record so that
// every start applies it, and changed at once on a running machine whose
// driver can (a driver.Forwarder). Host ports come from the book of the
// ports all VMs hold (internal/portbook).
//
// It drives no VM itself: it finds and locks a VM and asks for its running
// machine through VMs, the small interface of vm's Manager it needs (cli
// wires it in).
package forward

import (
	"context"
	"fmt"
	"slices"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/portbook"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/hashicorp/go-hclog"
)

// VMs is what the port commands need of agent-vm's VMs; vm's Manager has
// it.
type VMs interface {
	// Recorded finds the VM name means, whose record must be readable.
	Recorded(ctx context.Context, name string) (state.Entry, error)
	// Locked finds the VM name means, as Recorded, and takes its lock;
	// the caller releases it.
	Locked(ctx context.Context, name string) (state.Entry, *state.Lock, error)
	// Book is the book of the host ports the VMs hold.
	Book() *portbook.Book
	// Live is the driver and machine of e's VM, and whether it runs.
	Live(ctx context.Context, e state.Entry) (driver.Driver, driver.Machine, bool, error)
}

// Change is what `port add` or `port rm` did.
type Change struct {
	Branch  string
	Slug    string
	Forward state.Forward
	// Live: the running VM's forwards changed now; otherwise the VM is
	// stopped and the change takes effect at its next start.
	Live bool
	// Unchanged: add found the forward already there, and did nothing.
	Unchanged bool
}

// Copy gives the VM name (a new fork) forwards of the guest ports of from
// (its source's), each on a host port of its own as Add picks one. A port
// that cannot be had is left out, with its error; the others are made.
func Copy(ctx context.Context, vms VMs, name string, from []state.Forward, log hclog.Logger) (made []state.Forward, errs []error) {
	for _, f := range from {
		ch, err := Add(ctx, vms, name, f.Guest, 0, log)
		if err != nil {
			errs = append(errs, fmt.Errorf("the forward of guest port %d: %w", f.Guest, err))
			continue
		}
		made = append(made, ch.Forward)
	}
	return made, errs
}

// Add forwards guestPort of the VM name means to 127.0.0.1:hostPort on
// the host, at once when the VM runs, and keeps the forward in the record
// so every start applies it. hostPort 0 picks one: the guest port's own
// number when it is free, else a free port of ports.ForwardRange.
//
// Adding a forward that is already there (the same guest port, to the same
// host port or with none given) changes nothing and is no error: a script
// that starts a dev server can ask for its port every time. The same guest
// port to another host port is an error, since a guest port has one
// forward.
func Add(ctx context.Context, vms VMs, name string, guestPort, hostPort int, log hclog.Logger) (*Change, error) {
	if err := checkGuestPort(guestPort); err != nil {
		return nil, err
	}
	if hostPort != 0 && (hostPort < 1 || hostPort > 65535) {
		return nil, fmt.Errorf("HOST_PORT %d is not a port number (hint: use 1024 to 65535, or leave it out to get a free one)", hostPort)
	}
	e, lock, err := vms.Locked(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	r := e.Record
	if err := checkNotEndpoint(r, guestPort); err != nil {
		return nil, err
	}
	ch := &Change{Branch: r.Branch, Slug: r.Slug}
	if i := forwardOf(r, guestPort); i >= 0 {
		f := r.Forwards[i]
		if hostPort != 0 && hostPort != f.Host {
			return nil, fmt.Errorf("guest port %d of %q is already forwarded to host port %d (hint: `agent-vm port rm --vm %s %d` first to forward it to another port)", guestPort, r.Branch, f.Host, r.Slug, guestPort)
		}
		ch.Forward, ch.Unchanged = f, true
		return ch, nil
	}
	// The ports lock, as create takes it (after the VM's): nobody else
	// may pick this host port before the record holds it.
	release, err := vms.Book().Lock(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	if ch.Forward.Host, err = vms.Book().ForForward(guestPort, hostPort); err != nil {
		return nil, err
	}
	ch.Forward.Guest, ch.Forward.Chosen = guestPort, hostPort != 0
	d, mach, running, err := vms.Live(ctx, e)
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
	log.Info("port forwarded", "vm", r.Slug, "guest", guestPort, "host", ch.Forward.Host, "live", ch.Live)
	return ch, nil
}

// Remove ends the forward of guestPort: at once when the VM runs, and
// in the record. A forward the VM does not have is an error.
func Remove(ctx context.Context, vms VMs, name string, guestPort int, log hclog.Logger) (*Change, error) {
	if err := checkGuestPort(guestPort); err != nil {
		return nil, err
	}
	e, lock, err := vms.Locked(ctx, name)
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
	ch := &Change{Branch: r.Branch, Slug: r.Slug, Forward: r.Forwards[i]}
	d, mach, running, err := vms.Live(ctx, e)
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
	log.Info("port forward removed", "vm", r.Slug, "guest", guestPort, "host", ch.Forward.Host, "live", ch.Live)
	return ch, nil
}

// List is `port list`: the VM's own forwards, in the order they were
// added, and whether the VM runs (they are live) or not.
func List(ctx context.Context, vms VMs, name string) ([]state.Forward, bool, error) {
	e, err := vms.Recorded(ctx, name)
	if err != nil {
		return nil, false, err
	}
	_, _, running, err := vms.Live(ctx, e)
	if err != nil {
		return nil, false, err
	}
	return e.Record.ForwardList(), running, nil
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
