package netpolicy

import (
	"context"
	"fmt"
	"slices"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/state"
)

// ExposedByCommand marks the ports `agent-vm port expose` added (its
// value is the command's old name, kept in records).
const ExposedByCommand = "expose"

// ExposeChange is what `port expose` or `port unexpose` did.
type ExposeChange struct {
	Branch string `json:"branch"`
	Port   int    `json:"port"`
	// GuestURL is where the guest reaches the port.
	GuestAddr string `json:"guest_addr"`
	Removed   bool   `json:"removed,omitempty"`
	Unchanged bool   `json:"unchanged,omitempty"`
	// Restart: the VM runs and the port opens only at its next start
	// (QEMU cannot add a guestfwd to a running VM). A removed port closes
	// at once.
	Restart bool `json:"restart,omitempty"`
}

// Expose lets the guest reach port on the host's 127.0.0.1 (at
// guest.HostAddr, same port), or with remove takes that away. These, and
// the ports `mcp sync` exposes, are the only host services a guest reaches.
func Expose(ctx context.Context, vms VMs, name string, port int, remove bool) (*ExposeChange, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("HOST_PORT %d is not a port number", port)
	}
	if port == guest.ProxyPort {
		return nil, fmt.Errorf("host port %d cannot be exposed: the guest reaches the egress proxy at %s:%d", port, guest.HostAddr, port)
	}
	e, lock, err := vms.Locked(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	r := e.Record
	if err := refuseUncontained(vms, r, "expose a host port"); err != nil {
		return nil, err
	}
	pins, err := vms.Pins()
	if err != nil {
		return nil, err
	}
	ch := &ExposeChange{Branch: r.Branch, Port: port, GuestAddr: fmt.Sprintf("%s:%d", guest.HostAddr, port), Removed: remove}
	has := func(x state.Exposed) bool { return x.Port == port }
	up := running(ctx, vms, e)
	switch {
	case remove && !slices.ContainsFunc(r.Exposed, has):
		return nil, fmt.Errorf("%q does not expose host port %d (hint: `agent-vm net show %s` lists its exposed ports)", r.Branch, port, r.Slug)
	case remove:
		r.Exposed = slices.DeleteFunc(r.Exposed, has)
	case slices.ContainsFunc(r.Exposed, has):
		ch.Unchanged = true
		return ch, nil
	default:
		r.Exposed = append(r.Exposed, state.Exposed{Port: port, Why: "exposed by the user", By: ExposedByCommand})
		ch.Restart = up
	}
	if err := state.WriteRecord(e.Layout.Record(), r); err != nil {
		return nil, err
	}
	if err := Write(e.Layout, r, pins); err != nil {
		return nil, err
	}
	if up {
		if err := vms.Publish(ctx, e); err != nil {
			return nil, fmt.Errorf("the change is recorded, but the VM's proxy did not get it: %w (hint: restart the VM to apply it)", err)
		}
	}
	return ch, nil
}
