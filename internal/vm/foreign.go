package vm

import (
	"context"
	"fmt"
	"time"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/sshconfig"
	"github.com/agent-vm/agent-vm/internal/state"
)

// A foreign guest is made from the user's own configuration and run as is;
// its backend says which VMs have one (backend.Foreigner). agent-vm runs
// its lifecycle (start, suspend, resume, stop, destroy with the workspace
// check) but sets up nothing inside it: no agent-mcp to wait for, no
// pinned host key to connect with, no holder, no guest steps at resume.
// SSH goes through the driver's endpoint (driver.ForeignReacher), which `agent-vm
// ssh-config` prints for OpenSSH.

// Foreign describes the guest of the VM whose record is r when it is
// foreign (ok): what create tells the user it lacks, and what every verb
// that would act on agent-vm's own guest asks.
func (m *Manager) Foreign(r *state.Record) (backend.Foreign, bool) {
	if r == nil {
		return backend.Foreign{}, false
	}
	f, is := m.Backends[r.Backend].(backend.Foreigner)
	if !is {
		return backend.Foreign{}, false
	}
	return f.Foreign(r)
}

// checkForeignFlags refuses create's flags that a foreign guest would
// ignore: its size, forwards and agent-mcp are its configuration's.
func (m *Manager) checkForeignFlags(o CreateOptions, r *state.Record) error {
	f, ok := m.Foreign(r)
	if !ok {
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
	return fmt.Errorf("%s does not apply to %s, which sets the VM's size and forwards and runs no agent-mcp (hint: drop %s and set it there, or %s)", flag, f.Config, flag, f.Own)
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

// ownGuest refuses a verb that needs agent-vm's own guest, lacks saying
// what it needs, when r's guest is foreign: what it lacks, and how to
// reach it instead.
func (m *Manager) ownGuest(r *state.Record, lacks string) error {
	f, ok := m.Foreign(r)
	if !ok {
		return nil
	}
	return fmt.Errorf("VM %q runs %s as is, so it has no %s (hint: %s; for agent-vm's own guest, %s)", r.Branch, f.Config, lacks, f.Reach, f.Own)
}

// foreignSSHConfig is the OpenSSH Host block of a foreign guest, from its
// driver's endpoint (sshconfig.Foreign).
func (m *Manager) foreignSSHConfig(ctx context.Context, e state.Entry) (string, error) {
	r, l := e.Record, e.Layout
	d, err := m.driverOf(r)
	if err != nil {
		return "", err
	}
	fs, ok := d.(driver.ForeignReacher)
	if !ok {
		return "", fmt.Errorf("VM %q has a foreign guest, and its %s driver cannot say how to reach it", r.Branch, d.Name())
	}
	ep, err := fs.ForeignSSH(ctx, m.machine(r, l))
	if err != nil {
		return "", err
	}
	return sshconfig.Foreign(r, ep), nil
}
