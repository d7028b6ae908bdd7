package vm

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/libvirt"
	"github.com/agent-vm/agent-vm/internal/state"
)

// A VM placed on another host (its record's Host, a qemu+ssh host) has its
// workspace there, not here: create clones the branch onto the host over
// agent-vm's link (gitws.CloneOnHost) and removes its local clone, so the
// agent's work has one home; sync fetches from the host
// (gitws.SyncFromHost); destroy syncs the branch before removing anything.

// placedDriver is the libvirt driver, which runs VMs placed on hosts.
func (m *Manager) placedDriver() (*libvirt.Driver, error) {
	d, ok := m.Drivers[libvirt.DriverName].(*libvirt.Driver)
	if !ok {
		return nil, errors.New("internal error: this agent-vm has no libvirt driver to place VMs on hosts with")
	}
	return d, nil
}

// hostGit is git's way to the host mach is placed on: the link open, and
// the command git runs as its ssh (agent-vm's own binary here). done
// closes the link.
func (m *Manager) hostGit(ctx context.Context, mach driver.Machine) (gitws.Host, func(), error) {
	r := mach.Remote
	if r.Addr == "" {
		return gitws.Host{}, nil, fmt.Errorf("host %s, which the VM is placed on, has no link set up here (hint: `agent-vm host list`; `agent-vm host link %s`)", r.Host, r.Host)
	}
	t := hostlink.Target{Addr: r.Addr, User: r.User, KeyFile: r.KeyFile, KnownHosts: r.KnownHosts}
	self, err := m.Executable()
	if err != nil {
		return gitws.Host{}, nil, fmt.Errorf("finding agent-vm's own binary, which git reaches host %s through: %w", r.Host, err)
	}
	c, err := hostlink.Dial(ctx, t)
	if err != nil {
		return gitws.Host{}, nil, fmt.Errorf("reaching host %s: %w", r.Host, err)
	}
	return gitws.Host{Name: r.Host, Run: hostlink.Runner{C: c}, SSH: hostlink.ExecArgv(self, t)}, func() { c.Close() }, nil
}

// placeWorkspace clones the new VM's branch onto its host, owned there by
// the guest user's ids, and removes the local clone create made. On
// failure what it made on the host is removed.
func (m *Manager) placeWorkspace(ctx context.Context, rec *state.Record, l state.Layout, o CreateOptions) error {
	mach := m.machine(rec, l)
	if mach.Remote == nil {
		return nil
	}
	d, err := m.placedDriver()
	if err != nil {
		return err
	}
	ws, err := d.PrepareHost(ctx, mach)
	if err != nil {
		return err
	}
	h, done, err := m.hostGit(ctx, mach)
	if err == nil {
		defer done()
		m.Log.Info("cloning the workspace onto the host", "host", mach.Remote.Host, "path", ws)
		_, err = m.Git.CloneOnHost(ctx, h, gitws.HostCloneOptions{
			CloneOptions: gitws.CloneOptions{Source: rec.Git.Source, Dest: ws, Branch: rec.Branch, From: o.From},
			UID:          rec.Guest.UID, GID: rec.Guest.GID})
	}
	if err != nil {
		m.unplace(ctx, rec, l)
		return err
	}
	return os.RemoveAll(l.Workspace())
}

// syncPlaced is Sync for a VM placed on a host.
func (m *Manager) syncPlaced(ctx context.Context, e state.Entry, mach driver.Machine) (*SyncResult, error) {
	h, done, err := m.hostGit(ctx, mach)
	if err != nil {
		return nil, err
	}
	defer done()
	return m.Git.SyncFromHost(ctx, h, libvirt.HostWorkspace(mach), e.Record.Git.Source, e.Record.Branch)
}

// unplace removes what create made on the host of a VM it then failed to
// make here.
func (m *Manager) unplace(ctx context.Context, rec *state.Record, l state.Layout) {
	mach := m.machine(rec, l)
	d, err := m.placedDriver()
	if err == nil && mach.Remote != nil {
		err = d.Destroy(context.WithoutCancel(ctx), mach)
	}
	if err != nil {
		m.Log.Warn("could not remove the VM's directory on its host after the failed create", "host", rec.Host, "error", err)
	}
}
