package vm

import (
	"context"
	"fmt"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/sshconfig"
	"github.com/agent-vm/agent-vm/internal/state"
)

// A foreign guest (state.Guest.Foreign) is made from the user's own
// configuration, run as is: today the repository's Vagrantfile under the
// vagrant backend. agent-vm runs its lifecycle (start, suspend, resume,
// stop, destroy with the workspace check) but set up nothing inside it: no
// agent-mcp to wait for, no pinned host key to connect with, no holder, no
// guest steps at resume. SSH goes through the driver's endpoint
// (foreignSSH), which `agent-vm ssh-config` prints for OpenSSH.

// ForeignLoses is what a VM of the repository's own Vagrantfile does not
// get, for create to tell the user (one line each).
var ForeignLoses = []string{
	"agent-mcp: the guest runs no agent-mcp, so there is no MCP endpoint nor `agent-vm mcp-config`",
	"a pinned host key: agent-vm reaches the guest with `vagrant ssh-config` (vagrant's own key, host key not checked), not its own keys",
	"port choice: the forwards are whatever the Vagrantfile says (create's --port and `agent-vm port` do not apply)",
	"the workspace share: the Vagrantfile's synced folders decide what the guest sees (its \".\" is this VM's workspace, the branch's clone)",
	"network containment: `agent-vm net` and `port expose` refuse the VM (as for every vagrant VM)",
	"agent-vm's provisioning: no user dev, agent CLI, packages or .agent-vm/provision.sh; the Vagrantfile's provisioners run instead",
}

// checkForeignFlags refuses create's flags that a foreign guest would
// ignore: its size, forwards and agent-mcp are its configuration's.
func checkForeignFlags(o CreateOptions, r *state.Record) error {
	if r.Guest.Foreign == "" {
		return nil
	}
	var flag string
	switch {
	case o.MCPPort != 0:
		flag = "--port"
	case o.CPUs != 0:
		flag = "--cpus"
	case o.MemoryMiB != 0:
		flag = "--memory"
	case o.DiskGiB != 0:
		flag = "--disk"
	case len(o.AllowOrigins) > 0:
		flag = "--allow-origin"
	default:
		return nil
	}
	return fmt.Errorf("%s does not apply to the repository's own Vagrantfile %s, which sets the VM's size and forwards and runs no agent-mcp (hint: drop %s and set it in the Vagrantfile, or pass --vagrantfile=generate to use agent-vm's own)", flag, r.Guest.Foreign, flag)
}

// foreignSSH is a driver that can say how to reach a foreign guest.
type foreignSSH interface {
	ForeignSSH(ctx context.Context, m driver.Machine) (driver.SSHEndpoint, error)
}

// foreignReady ends a start or resume of a foreign guest: the driver
// waited for it (vagrant up and resume wait for its SSH, and up runs its
// provisioners), and nothing of agent-vm's runs in it to wait for.
func (m *Manager) foreignReady(ctx context.Context, e state.Entry, d driver.Driver, mach driver.Machine, res *StartResult) *StartResult {
	if err := d.MarkReady(mach, time.Now()); err != nil {
		m.Log.Warn("could not record that the VM is up", "error", err)
	}
	res.Info = m.Status(ctx, e, true)
	return res
}

// errForeign is what a verb that needs agent-vm's own guest says of a
// foreign one: what it lacks, and how to reach it instead.
func errForeign(r *state.Record, lacks string) error {
	return fmt.Errorf("VM %q runs the repository's own Vagrantfile %s as is, so it has no %s (hint: `agent-vm ssh-config %s >> ~/.ssh/config` and `ssh %s` reach it with vagrant's key; for agent-vm's own guest, destroy it and create it with --vagrantfile=generate)",
		r.Branch, r.Guest.Foreign, lacks, r.Slug, sshconfig.Alias(r.Slug))
}

// foreignSSHConfig is the OpenSSH Host block of a foreign guest, from its
// driver's endpoint (sshconfig.Foreign).
func (m *Manager) foreignSSHConfig(ctx context.Context, e state.Entry) (string, error) {
	r, l := e.Record, e.Layout
	d, err := m.driverOf(r)
	if err != nil {
		return "", err
	}
	fs, ok := d.(foreignSSH)
	if !ok {
		return "", fmt.Errorf("VM %q has a foreign guest, and its %s driver cannot say how to reach it", r.Branch, d.Name())
	}
	ep, err := fs.ForeignSSH(ctx, m.machine(r, l))
	if err != nil {
		return "", err
	}
	return sshconfig.Foreign(r, ep), nil
}
