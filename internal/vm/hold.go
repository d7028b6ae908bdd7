package vm

import (
	"context"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/guestconn"
	"github.com/agent-vm/agent-vm/internal/state"
)

// guestOf is how the VM of r and l is reached (internal/guestconn).
func (m *Manager) guestOf(r *state.Record, l state.Layout) guestconn.Guest {
	return guestconn.Guest{Record: r, Layout: l, Log: m.Log}
}

// dialGuest is the one place vm connects to a guest (guestconn's Dial),
// which a foreign guest refuses: it has no pinned host key.
func (m *Manager) dialGuest(ctx context.Context, r *state.Record, l state.Layout) (*ssh.Client, error) {
	if err := m.ownGuest(r, "pinned host key for agent-vm to connect with"); err != nil {
		return nil, err
	}
	return m.guestOf(r, l).Dial(ctx)
}

// runRoot runs a shell script as root in the guest (guestconn's Root);
// script is called once connected.
func (m *Manager) runRoot(ctx context.Context, e state.Entry, script func() string) (code int, stdout, stderr string, err error) {
	if err := m.ownGuest(e.Record, "pinned host key for agent-vm to connect with"); err != nil {
		return -1, "", "", err
	}
	return m.guestOf(e.Record, e.Layout).Root(ctx, script)
}

// startHolder starts the VM's holder, unless its guest is foreign (nothing
// to hold it with, see foreign.go).
func (m *Manager) startHolder(e state.Entry) {
	if _, foreign := m.Foreign(e.Record); foreign {
		return
	}
	m.guestOf(e.Record, e.Layout).StartHolder(m.Run, m.executable)
}

// waitHolder: see guestconn.Guest's WaitHolder.
func (m *Manager) waitHolder(ctx context.Context, e state.Entry, limit time.Duration) {
	m.guestOf(e.Record, e.Layout).WaitHolder(ctx, limit)
}
