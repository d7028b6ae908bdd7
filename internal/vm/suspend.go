package vm

import (
	"context"
	"fmt"
	"time"

	"github.com/agent-vm/agent-vm/internal/sshx"
)

// Suspend keeps a running VM's memory and stops its guest from running,
// through its driver's Suspend (for the vagrant backend: a paused QEMU
// that still holds the memory). A driver that cannot answers
// driver.ErrUnsupported, named in the error.
func (m *Manager) Suspend(ctx context.Context, name string) (*Info, error) {
	e, lock, err := m.lockedEntry(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	d, err := m.driverOf(e.Record)
	if err != nil {
		return nil, err
	}
	if err := d.Suspend(ctx, m.machine(e.Record, e.Layout)); err != nil {
		return nil, fmt.Errorf("suspending %q: %w", e.Record.Branch, err)
	}
	info := m.Status(ctx, e, false)
	return &info, nil
}

// Resume continues a suspended VM and waits for its SSH (with the pinned
// host key) to answer again.
func (m *Manager) Resume(ctx context.Context, name string) (*Info, error) {
	e, lock, err := m.lockedEntry(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	d, err := m.driverOf(e.Record)
	if err != nil {
		return nil, err
	}
	if err := d.Resume(ctx, m.machine(e.Record, e.Layout)); err != nil {
		return nil, fmt.Errorf("resuming %q: %w", e.Record.Branch, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := sshx.WaitReady(wctx, sshTarget(e.Record, e.Layout), nil)
	if err != nil {
		return nil, fmt.Errorf("%q resumed, but its SSH does not answer: %w (hint: `agent-vm logs %s`; `agent-vm stop %s` and start it again)", e.Record.Branch, err, e.Record.Slug, e.Record.Slug)
	}
	c.Close()
	info := m.Status(ctx, e, true)
	return &info, nil
}
