package vm

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/hosts"
)

// HostDoctor runs `host doctor` on the registered host called name,
// through the Manager's runner.
func (m *Manager) HostDoctor(ctx context.Context, name string) (hosts.Report, error) {
	if m.Hosts == nil {
		return hosts.Report{}, errors.New("internal error: no hosts registry")
	}
	h, err := m.Hosts.Get(name)
	if err != nil {
		return hosts.Report{}, err
	}
	if h.Link != nil {
		// Asked on the host over agent-vm's own link, which placing VMs
		// uses, rather than through the user's ssh: what the VMs will
		// meet. A link that does not connect falls back to the user's
		// ssh, and the link's own line says why it failed.
		lctx, cancel := context.WithTimeout(ctx, hostlink.Timeout)
		c, err := hostlink.Dial(lctx, h.Link.Target())
		cancel()
		if err == nil {
			defer c.Close()
			return (&hosts.Doctor{Run: hostlink.Runner{C: c}, OnHost: true}).Check(ctx, h), nil
		}
	}
	return (&hosts.Doctor{Run: m.Run}).Check(ctx, h), nil
}

// checkPlacement checks create's --host: a registered host, whose VMs the
// libvirt backend runs (auto becomes libvirt; another backend is refused).
// The host's system libvirtd runs them: a session daemon is refused, and
// another machine must have agent-vm's link set up (`host link`).
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
	if m.Hosts == nil {
		return errors.New("internal error: no hosts registry")
	}
	h, err := m.Hosts.Get(o.Host)
	if err != nil {
		return err
	}
	u, err := hosts.ParseURI(h.URI)
	if err != nil {
		return err
	}
	if u.Daemon != "system" {
		return fmt.Errorf("host %s (%s) is a session libvirtd, and the libvirt backend runs VMs on the system one, as root, for their networks' containment (hint: `agent-vm host add NAME qemu:///system`)", h.Name, h.URI)
	}
	if u.Remote() && h.Link == nil {
		return fmt.Errorf("host %s (%s) is another machine, which agent-vm reaches only over its own SSH link, not set up yet (hint: `agent-vm host link %s`, then `agent-vm host doctor %s`)", h.Name, h.URI, h.Name, h.Name)
	}
	return nil
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
// are placed on the host, naming them.
// Before the entry goes, agent-vm's binary is removed from a linked host
// (the copies no process runs, hostlink.Uninstall); a host that cannot be
// reached keeps them, which the log says, and is forgotten all the same.
func (m *Manager) RemoveHost(ctx context.Context, name string) error {
	if m.Hosts == nil {
		return errors.New("internal error: no hosts registry")
	}
	on, err := m.VMsOnHost(name)
	if err != nil {
		return err
	}
	if len(on) > 0 {
		return fmt.Errorf("host %s has VMs placed on it: %s (hint: `agent-vm destroy` them first)", name, strings.Join(on, ", "))
	}
	if h, err := m.Hosts.Get(name); err == nil && h.Link != nil {
		bin := path.Join(h.AgentDir(), "bin")
		lctx, cancel := context.WithTimeout(ctx, hostlink.Timeout)
		c, err := hostlink.Dial(lctx, h.Link.Target())
		cancel()
		if err == nil {
			err = hostlink.Uninstall(ctx, c, bin)
			c.Close()
		}
		if err != nil {
			m.Log.Warn("agent-vm's binary stays on the host: remove it there by hand", "host", name, "dir", bin, "error", err)
		}
	}
	return m.Hosts.Remove(name)
}
