package vm

import (
	"context"
	"fmt"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/hosts"
	"github.com/agent-vm/agent-vm/internal/placement"
	"github.com/agent-vm/agent-vm/internal/state"
)

// A VM placed on another host (its record's Host) is run there by its
// driver (a driver.Placer) and has its workspace there: vm reaches what
// that takes beyond running it through the VM's placement.Site.

// site is the placement.Site of the VM whose record is r and machine
// mach, or nil when the VM runs on this machine.
func (m *Manager) site(r *state.Record, mach driver.Machine) (*placement.Site, error) {
	if mach.Remote == nil {
		return nil, nil
	}
	d, err := m.driverOf(r)
	if err != nil {
		return nil, err
	}
	p, ok := d.(driver.Placer)
	if !ok {
		return nil, fmt.Errorf("internal error: the %s driver places no VM on another host", d.Name())
	}
	return &placement.Site{Mach: mach, Placer: p, Git: m.Git, Log: m.Log, Executable: m.executable}, nil
}

// siteOf is site for the VM of e.
func (m *Manager) siteOf(e state.Entry) (*placement.Site, error) {
	return m.site(e.Record, m.machine(e.Record, e.Layout))
}

// WorkspacePath is where the workspace of the VM whose record is r lies:
// its path on the VM's host when it is placed on another machine (host
// names it), else here.
func (m *Manager) WorkspacePath(r *state.Record, l state.Layout) (path, host string) {
	mach := m.machine(r, l)
	if mach.Remote == nil {
		return l.Workspace(), ""
	}
	if s, err := m.site(r, mach); err == nil {
		return s.Paths().Workspace, mach.Remote.Host
	}
	return "", mach.Remote.Host
}

// checkPlacement checks create's --host: a registered host that can take
// a VM (placement.CheckHost), whose VMs the libvirt backend runs (auto
// becomes libvirt; another backend is refused).
func (m *Manager) checkPlacement(o *CreateOptions) error {
	if o.Host == "" {
		return nil
	}
	switch o.Backend {
	case "", BackendAuto:
		o.Backend = BackendLibvirt
	case BackendLibvirt:
	default:
		return fmt.Errorf("--host %s places the VM through libvirt, which the %s backend does not use (hint: drop --backend, or pass --backend libvirt)", o.Host, o.Backend)
	}
	return placement.CheckHost(m.Hosts, o.Host, o.Net)
}

// HostDoctor runs `host doctor` on the registered host called name.
func (m *Manager) HostDoctor(ctx context.Context, name string) (hosts.Report, error) {
	return placement.Doctor(ctx, m.Hosts, m.Run, name)
}

// VMsOnHost lists the VMs of this state directory placed on the host
// name, by slug.
func (m *Manager) VMsOnHost(name string) ([]string, error) {
	es, err := m.Root.List()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range es {
		if e.Record != nil && e.Record.Host == name {
			out = append(out, e.Slug)
		}
	}
	return out, nil
}

// RemoveHost is `host rm`: it refuses while VMs of this state directory
// are placed on the host (placement.Forget).
func (m *Manager) RemoveHost(ctx context.Context, name string) error {
	on, err := m.VMsOnHost(name)
	if err != nil {
		return err
	}
	return placement.Forget(ctx, m.Hosts, name, on, m.Log)
}
