package vm

import (
	"context"
	"errors"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/hold"
	"github.com/agent-vm/agent-vm/internal/state"
)

// ReloadBridges has the holder of e's running VM open the browser bridges
// its bridge file names (internal/bridge) and close the others (the
// browser room writes the file, under the VM's lock, and calls this).
func (m *Manager) ReloadBridges(ctx context.Context, e state.Entry) error {
	if err := m.ownGuest(e.Record, "pinned host key to hold a connection with, which the browser bridges need"); err != nil {
		return err
	}
	err := m.guestOf(e.Record, e.Layout).ReloadBridges(ctx)
	if errors.Is(err, hold.ErrNoHolder) {
		return errors.New("the VM's held connection is not running, and browser bridges live in it (hint: `agent-vm start " + e.Slug + "` starts it again; its log is " + e.Layout.Log(hold.LogName) + ")")
	}
	return err
}

// closeBridges forgets e's browser bridges: a boot starts with none, and a
// stop ends them with the holder.
func (m *Manager) closeBridges(e state.Entry) {
	if err := bridge.WriteConfig(e.Layout.RunDir(), bridge.Config{}); err != nil {
		m.Log.Warn("could not remove the VM's browser bridge file", "error", err)
	}
}
