// Package portbook is the book of the host ports agent-vm's VMs hold: every
// port a VM record (or a create in progress) holds, in a state directory and
// in this user's other registered ones (state.Registry), since ports are
// one namespace for the host; the lock that serialises picking new ones;
// and picking them, for a new VM (Assign) and a forward (ForForward).
package portbook

import (
	"context"
	"fmt"
	"slices"

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
	release, err := b.Lock(ctx)
	if err != nil {
		return err
	}
	defer release()
	taken, err := b.Taken()
	if err != nil {
		return err
	}
	if mcp != 0 {
		if err := ports.Check(mcp, taken, b.Free); err != nil {
			return fmt.Errorf("--port: %w", err)
		}
		rec.Ports.MCP = mcp
		taken[mcp] = "this VM"
	} else if rec.Ports.MCP, err = ports.Pick(ports.MCPRange(), taken, b.Free); err != nil {
		return err
	}
	taken[rec.Ports.MCP] = "this VM"
	if ssh != 0 {
		if err := ports.CheckAs(ssh, "--ssh-port", taken, b.Free); err != nil {
			return fmt.Errorf("--ssh-port: %w", err)
		}
		rec.Ports.SSH = ssh
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
