package vm

import (
	"context"
	"fmt"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Suspend keeps a running VM's memory and stops its guest from running,
// through its driver's Suspend (for the vagrant backend: a paused QEMU
// that still holds the memory). A driver that cannot answers
// driver.ErrUnsupported, named in the error.
func (m *Manager) Suspend(ctx context.Context, name string) (*Info, error) {
	return m.driverVerb(ctx, name, "suspending", func(e state.Entry, d driver.Driver, mach driver.Machine) error {
		return d.Suspend(ctx, mach)
	})
}

// Resume continues a suspended VM and waits for its SSH (with the pinned
// host key) to answer again: vagrant-libvirt starts its port forwards
// again without waiting for them.
func (m *Manager) Resume(ctx context.Context, name string) (*Info, error) {
	return m.driverVerb(ctx, name, "resuming", func(e state.Entry, d driver.Driver, mach driver.Machine) error {
		if err := d.Resume(ctx, mach); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		c, err := sshx.WaitReady(wctx, sshTarget(e.Record, e.Layout), nil)
		if err != nil {
			return fmt.Errorf("it resumed, but its SSH does not answer: %w (hint: `agent-vm logs %s`; `agent-vm stop %s` and start it again)", err, e.Record.Slug, e.Record.Slug)
		}
		return c.Close()
	})
}

// driverVerb runs one driver verb on a VM under its lock and reports the
// VM's status afterwards.
func (m *Manager) driverVerb(ctx context.Context, name, doing string, verb func(state.Entry, driver.Driver, driver.Machine) error) (*Info, error) {
	e, lock, err := m.lockedEntry(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	d, err := m.driverOf(e.Record)
	if err != nil {
		return nil, err
	}
	if err := verb(e, d, m.machine(e.Record, e.Layout)); err != nil {
		return nil, fmt.Errorf("%s %q: %w", doing, e.Record.Branch, err)
	}
	info := m.Status(ctx, e, true)
	return &info, nil
}
