// Package portbook is the book of the host ports agent-vm's VMs hold: every
// port a VM record (or a create in progress) holds, in a state directory and
// in this user's other registered ones (state.Registry), since ports are
// one namespace for the host; the lock that serialises picking new ones;
// and picking them, for a new VM (Assign), a forward (ForForward), and
// again at a start that finds another program on one (Rebind).
package portbook

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Book reads and takes the ports of Root's VMs and of Registry's.
type Book struct {
	Root *state.Root
	// Registry lists this user's other state directories, whose VMs'
	// ports are taken too; nil: only Root's.
	Registry *state.Registry
	// Free probes a host port (ports.Listenable outside tests).
	Free ports.Probe
	// Log receives a warning when the other state directories cannot be
	// listed; nil: none.
	Log hclog.Logger
}

// Assign picks a new VM's SSH and MCP ports (mcp and ssh when not 0, the
// user's --port and --ssh-port, else free ones) under the ports lock and
// writes its staging record, rec in l, at once, so concurrent creates see
// the ports as taken before this one finishes.
func (b *Book) Assign(ctx context.Context, mcp, ssh int, rec *state.Record, l state.Layout) error {
	taken, release, err := b.lockTaken(ctx)
	if err != nil {
		return err
	}
	defer release()
	if mcp != 0 {
		if err := ports.Check(mcp, taken, b.Free); err != nil {
			return fmt.Errorf("--port: %w", err)
		}
		rec.Ports.MCP = mcp
		rec.Ports.MCPChosen = true
	} else if rec.Ports.MCP, err = ports.Pick(ports.MCPRange(), taken, b.Free); err != nil {
		return err
	}
	taken[rec.Ports.MCP] = "this VM"
	if ssh != 0 {
		if err := ports.CheckAs(ssh, "--ssh-port", taken, b.Free); err != nil {
			return fmt.Errorf("--ssh-port: %w", err)
		}
		rec.Ports.SSH = ssh
		rec.Ports.SSHChosen = true
	} else if rec.Ports.SSH, err = ports.Pick(ports.SSHRange(), taken, b.Free); err != nil {
		return err
	}
	return state.WriteRecord(l.Record(), rec)
}

// Taken maps every port some VM record (or a create in progress)
// holds, in Root and in this user's other registered state directories,
// to a description of its owner.
//
// A create commits (renames its staging directory into place) without the
// ports lock, so the two reads of a state directory must come in the one
// order that cannot miss it: creates in progress first, then the VM
// directories. A create that commits between the reads is in the second;
// one that commits before the first is in the second too; one still
// staging is in the first.
func (b *Book) Taken() (map[int]string, error) {
	taken := map[int]string{}
	add := func(r *state.Record, what string) {
		taken[r.Ports.SSH] = fmt.Sprintf("%s %q (ssh)", what, r.Branch)
		taken[r.Ports.MCP] = fmt.Sprintf("%s %q (mcp)", what, r.Branch)
		for _, f := range r.Forwards {
			taken[f.Host] = fmt.Sprintf("%s %q (its forward of guest port %d)", what, r.Branch, f.Guest)
		}
	}
	roots := []*state.Root{b.Root}
	for _, dir := range b.otherRoots() {
		roots = append(roots, &state.Root{Dir: dir})
	}
	for i, root := range roots {
		where := ""
		if i > 0 {
			where = " (state directory " + root.Dir + ")"
		}
		staged := root.StagedRecords()
		betweenPortReads()
		entries, err := root.List()
		if err != nil {
			if i == 0 {
				return nil, err
			}
			continue // another directory, gone or unreadable since the registry listed it
		}
		for _, r := range staged {
			add(r, "the VM being created"+where+" for branch")
		}
		for _, e := range entries {
			if e.Record != nil {
				add(e.Record, "the VM"+where+" of branch")
			}
		}
	}
	return taken, nil
}

// lockTaken takes the ports lock (Lock) and reads what is taken under it
// (Taken); the caller releases the lock.
func (b *Book) lockTaken(ctx context.Context) (map[int]string, func(), error) {
	release, err := b.Lock(ctx)
	if err != nil {
		return nil, nil, err
	}
	taken, err := b.Taken()
	if err != nil {
		release()
		return nil, nil, err
	}
	return taken, release, nil
}

// Lock takes the ports lock of every state directory of this user
// (the registry's), then Root's, in that order; release undoes both.
func (b *Book) Lock(ctx context.Context) (release func(), err error) {
	var outer *state.Lock
	if b.Registry != nil {
		if outer, err = b.Registry.LockPorts(ctx); err != nil {
			return nil, err
		}
	}
	inner, err := b.Root.LockPorts(ctx)
	if err != nil {
		if outer != nil {
			outer.Release()
		}
		return nil, err
	}
	return func() {
		inner.Release()
		if outer != nil {
			outer.Release()
		}
	}, nil
}

// otherRoots are the registered state directories besides Root.
func (b *Book) otherRoots() []string {
	if b.Registry == nil {
		return nil
	}
	roots, err := b.Registry.Roots()
	if err != nil {
		if b.Log != nil {
			b.Log.Warn("the ports of VMs in other state directories are not known", "error", err)
		}
		return nil
	}
	return slices.DeleteFunc(roots, func(r string) bool { return r == b.Root.Dir })
}

// betweenPortReads lets a test commit a create between Taken's two
// reads, the interleaving that once handed two VMs the same ports.
var betweenPortReads = func() {}

// ForForward chooses the host port of a new forward of guestPort: hostPort
// when not 0 and free, else guestPort's own number when it is free and
// not privileged, else a free port of ports.ForwardRange. The caller holds
// the ports lock.
func (b *Book) ForForward(guestPort, hostPort int) (int, error) {
	taken, err := b.Taken()
	if err != nil {
		return 0, err
	}
	if hostPort != 0 {
		if err := ports.CheckAs(hostPort, "HOST_PORT", taken, b.Free); err != nil {
			return 0, err
		}
		return hostPort, nil
	}
	if _, ok := taken[guestPort]; !ok && guestPort >= 1024 && b.Free(guestPort) {
		return guestPort, nil
	}
	return ports.Pick(ports.ForwardRange(), taken, b.Free)
}

// Rebind readies the ports r holds for its VM's start (its machine's
// process gone; l its directory): a port agent-vm picked that another
// program now listens on is replaced by a free one, in r and in the
// pinned host key when the SSH port moved; the caller describes its
// machine again. The book sees the VMs of this user's state directories
// only: another user's VM, or one of a state directory not registered
// here (a test's), may have taken the port while this VM was stopped, and
// whichever started second failed. A port the user chose
// (Ports.SSHChosen, MCPChosen, Forward.Chosen) is left for the driver's
// check at the start, which names it and the fix; a foreign guest's
// forwards are its own configuration's.
func (b *Book) Rebind(ctx context.Context, r *state.Record, l state.Layout) error {
	if r.Guest.Foreign != "" {
		return nil
	}
	type slot struct {
		name string
		port *int
		r    ports.Range
	}
	var slots []slot
	if !r.Ports.SSHChosen {
		slots = append(slots, slot{"ssh", &r.Ports.SSH, ports.SSHRange()})
	}
	if !r.Ports.MCPChosen {
		slots = append(slots, slot{"mcp", &r.Ports.MCP, ports.MCPRange()})
	}
	for i, f := range r.Forwards {
		if !f.Chosen {
			slots = append(slots, slot{fmt.Sprintf("forward of guest port %d", f.Guest), &r.Forwards[i].Host, ports.ForwardRange()})
		}
	}
	// A port stays when it is free, or comes free within the grace a
	// process that just exited (this VM's QEMU) may hold it: one grace
	// for all of them.
	var held []slot
	deadline := time.Now().Add(rebindGrace)
	for _, s := range slots {
		if ports.CheckForward(*s.port, s.name, b.Free, time.Until(deadline)) != nil {
			held = append(held, s)
		}
	}
	if len(held) == 0 {
		return nil
	}
	taken, release, err := b.lockTaken(ctx)
	if err != nil {
		return err
	}
	defer release()
	oldSSH, was := r.Ports.SSH, make([]int, len(held))
	for i, s := range held {
		p, err := ports.Pick(s.r, taken, b.Free)
		if err != nil {
			return fmt.Errorf("port %d (%s) of %q is in use by another program, and no other is free: %w", *s.port, s.name, r.Branch, err)
		}
		was[i], *s.port, taken[p] = *s.port, p, "this VM"
	}
	if r.Ports.SSH != oldSSH {
		if err := l.PinHostKey(l.KnownHosts(), r.Ports.SSH); err != nil {
			return err
		}
	}
	if err := state.WriteRecord(l.Record(), r); err != nil {
		if r.Ports.SSH != oldSSH {
			_ = l.PinHostKey(l.KnownHosts(), oldSSH) // the record still names the old port
		}
		return err
	}
	for i, s := range held {
		if b.Log != nil {
			b.Log.Warn("another program listens on a port this VM had; it moved to a free one", "vm", r.Branch, "port", s.name, "was", was[i], "now", *s.port,
				"hint", "what you pointed at the old port (a copied `agent-vm ssh-config`, an MCP client) needs the new one, which `agent-vm status` shows; --port and --ssh-port at create give ports of your own")
		}
	}
	return nil
}

// rebindGrace is how long Rebind waits for a port to come free before it
// moves it; a test shortens it.
var rebindGrace = 3 * time.Second
