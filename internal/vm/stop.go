package vm

import (
	"context"
	"errors"
	"time"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/state"
)

// StopResult says what stop found and did.
type StopResult struct {
	Branch string
	Was    string // the state before stopping
	// Suspend is how the VM kept its memory when it Was suspended
	// (vminfo.SuspendPaused, vminfo.SuspendSaved).
	Suspend string
}

// Stop shuts a VM down cleanly (see driver.Driver's Stop).
func (m *Manager) Stop(ctx context.Context, name string) (*StopResult, error) {
	e, lock, err := m.Locked(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	was, err := m.stopLocked(ctx, e)
	if err != nil {
		return nil, err
	}
	return &StopResult{Branch: e.Record.Branch, Was: was.State, Suspend: was.Suspend}, nil
}

// stopLocked stops the VM of e (the caller holds its lock) and returns
// what it found before stopping it.
func (m *Manager) stopLocked(ctx context.Context, e state.Entry) (driver.Live, error) {
	d, err := m.driverOf(e.Record)
	if err != nil {
		return driver.Live{}, err
	}
	live, err := m.stopMachine(ctx, d, m.machine(e.Record, e.Layout))
	m.guestOf(e.Record, e.Layout).StopHolder(ctx)
	m.closeBridges(e)
	return live, err
}

// stopMachine stops a VM (the caller holds its lock) and returns what it
// found before stopping it.
func (m *Manager) stopMachine(ctx context.Context, d driver.Driver, mach driver.Machine) (driver.Live, error) {
	live, err := d.Inspect(ctx, mach)
	if err != nil {
		return live, err
	}
	grace := 30 * time.Second
	if live.Launch != nil && live.Launch.Accel == accel.TCG {
		grace = 90 * time.Second
	}
	err = d.Stop(ctx, mach, grace)
	if errors.Is(err, driver.ErrNotRunning) {
		return live, nil
	}
	return live, err
}

// Restart stops the VM if it runs, then starts it.
func (m *Manager) Restart(ctx context.Context, name string, o StartOptions) (*StartResult, error) {
	if _, err := m.Stop(ctx, name); err != nil {
		return nil, err
	}
	return m.Start(ctx, name, o)
}
