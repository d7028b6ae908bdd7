package placement

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/hosts"
)

// errNoRegistry: a Manager made without the hosts' registry.
var errNoRegistry = errors.New("internal error: no hosts registry")

// Doctor runs `host doctor` on the registered host called name: over
// agent-vm's own link when it has one, which placing VMs uses, rather than
// through the user's ssh (run), so it checks what the VMs will meet. A
// link that does not connect falls back to the user's ssh, and the link's
// own line says why it failed.
func Doctor(ctx context.Context, reg *hosts.Registry, run execx.Runner, name string) (hosts.Report, error) {
	if reg == nil {
		return hosts.Report{}, errNoRegistry
	}
	h, err := reg.Get(name)
	if err != nil {
		return hosts.Report{}, err
	}
	if h.Link != nil {
		lctx, cancel := context.WithTimeout(ctx, hostlink.Timeout)
		c, err := hostlink.Dial(lctx, h.Link.Target())
		cancel()
		if err == nil {
			defer c.Close()
			return (&hosts.Doctor{Run: hostlink.Runner{C: c}, OnHost: true}).Check(ctx, h), nil
		}
	}
	return (&hosts.Doctor{Run: run}).Check(ctx, h), nil
}

// CheckHost checks that a VM can be placed on the registered host called
// name: the host's system libvirtd runs it (a session daemon is refused),
// and another machine must have agent-vm's link set up (`host link`) and
// a VM whose egress mode (netMode) is not ask, whose proxy runs here.
func CheckHost(reg *hosts.Registry, name, netMode string) error {
	if reg == nil {
		return errNoRegistry
	}
	h, err := reg.Get(name)
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
	if u.Remote() && netMode == egress.ModeAsk {
		return fmt.Errorf("--net ask holds a connection while you are asked, by the VM's proxy, which for a VM on host %s runs there: mode ask is for VMs on this machine (hint: --net allow, and `agent-vm net allow --vm BRANCH DOMAIN` for a name the VM needs)", h.Name)
	}
	return nil
}

// Forget is `host rm` of the host called name, on which the VMs placed
// (by slug) are on: it refuses while there are some, naming them. Before
// the entry goes, agent-vm's binary is removed from a linked host (the
// copies no process runs, hostlink.Uninstall); a host that cannot be
// reached keeps them, which the log says, and is forgotten all the same.
func Forget(ctx context.Context, reg *hosts.Registry, name string, on []string, log hclog.Logger) error {
	if reg == nil {
		return errNoRegistry
	}
	if len(on) > 0 {
		return fmt.Errorf("host %s has VMs placed on it: %s (hint: `agent-vm destroy` them first)", name, strings.Join(on, ", "))
	}
	if h, err := reg.Get(name); err == nil && h.Link != nil {
		bin := path.Join(h.AgentDir(), "bin")
		lctx, cancel := context.WithTimeout(ctx, hostlink.Timeout)
		c, err := hostlink.Dial(lctx, h.Link.Target())
		cancel()
		if err == nil {
			err = hostlink.Uninstall(ctx, c, bin)
			c.Close()
		}
		if err != nil {
			log.Warn("agent-vm's binary stays on the host: remove it there by hand", "host", name, "dir", bin, "error", err)
		}
	}
	return reg.Remove(name)
}
