package vm

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/guestconn"
	"github.com/agent-vm/agent-vm/internal/hold"
	"github.com/agent-vm/agent-vm/internal/state"
)

// HoldCommand is the hidden command that runs a VM's holder: the held
// connection every command reaches the guest through (internal/hold).
const HoldCommand = hold.Command

// guestOf is how the VM of r and l is reached (internal/guestconn).
func (m *Manager) guestOf(r *state.Record, l state.Layout) guestconn.Guest {
	return guestconn.Guest{Record: r, Layout: l, Log: m.Log}
}

// dialGuest is the one place vm connects to a guest (guestconn's Dial),
// which a foreign guest refuses: it has no pinned host key.
func (m *Manager) dialGuest(ctx context.Context, r *state.Record, l state.Layout) (*ssh.Client, error) {
	if r.Guest.Foreign != "" {
		return nil, errForeign(r, "pinned host key for agent-vm to connect with")
	}
	return m.guestOf(r, l).Dial(ctx)
}

// runRoot runs a shell script as root in the guest (guestconn's Root);
// script is called once connected.
func (m *Manager) runRoot(ctx context.Context, e state.Entry, script func() string) (code int, stdout, stderr string, err error) {
	if e.Record.Guest.Foreign != "" {
		return -1, "", "", errForeign(e.Record, "pinned host key for agent-vm to connect with")
	}
	return m.guestOf(e.Record, e.Layout).Root(ctx, script)
}

// startHolder starts the VM's holder, unless its guest is foreign (nothing
// to hold it with, see foreign.go).
func (m *Manager) startHolder(e state.Entry) {
	if e.Record.Guest.Foreign != "" {
		return
	}
	exe := m.Executable
	if exe == nil {
		exe = os.Executable
	}
	m.guestOf(e.Record, e.Layout).StartHolder(m.Run, exe)
}

// waitHolder and stopHolder: see guestconn.Guest's WaitHolder and
// StopHolder.
func (m *Manager) waitHolder(ctx context.Context, e state.Entry, limit time.Duration) {
	m.guestOf(e.Record, e.Layout).WaitHolder(ctx, limit)
}

func (m *Manager) stopHolder(ctx context.Context, e state.Entry) {
	m.guestOf(e.Record, e.Layout).StopHolder(ctx)
}

// ServeHold runs the holder of the VM whose directory is dir until ctx
// ends or its connection to the guest does (the hidden __hold command).
func ServeHold(ctx context.Context, dir string, logger hclog.Logger) error {
	l := state.Layout{Dir: dir}
	r, err := state.ReadRecord(l.Record())
	if err != nil {
		return fmt.Errorf("reading the VM of %s: %w (hint: `agent-vm start` runs the holder itself, with the VM's directory)", dir, err)
	}
	if r.Guest.Foreign != "" {
		return errForeign(r, "pinned host key to hold a connection with")
	}
	return guestconn.Guest{Record: r, Layout: l, Log: logger}.Serve(ctx)
}
