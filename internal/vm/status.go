package vm

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/sshconfig"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// Status reads a VM's record and live state. withHealth also asks agent-mcp
// for /health (one HTTP request through the forwarded port).
func (m *Manager) Status(ctx context.Context, e state.Entry, withHealth bool) vminfo.Info {
	if e.Record == nil {
		return vminfo.Info{Slug: e.Slug, State: vminfo.StateInvalid, Error: e.Err.Error(), Forwards: []state.Forward{}, Paths: vminfo.PathsInfo{Dir: e.Layout.Dir}}
	}
	r, l := e.Record, e.Layout
	info := vminfo.Info{
		Branch: r.Branch, Slug: r.Slug, Backend: r.Backend, Host: r.Host, CreatedAt: r.CreatedAt,
		Ports: r.Ports, Forwards: r.ForwardList(), ShareCache: driver.Share{Cache: r.WorkspaceCache}.CacheMode(), Resources: r.Resources, Git: r.Git, HostCA: !r.NoHostCA, AgentCLI: r.Agent, Secrets: append([]string{}, slices.Sorted(maps.Keys(r.Placeholders))...),
		SSH: vminfo.SSHInfo{Host: "127.0.0.1", Port: r.Ports.SSH, User: r.Guest.User, IdentityFile: l.ClientKey(),
			KnownHostsFile: l.KnownHosts(), Alias: sshconfig.Alias(r.Slug)},
		MCP:   vminfo.MCPInfo{URL: fmt.Sprintf("http://127.0.0.1:%d/mcp", r.Ports.MCP), Health: fmt.Sprintf("http://127.0.0.1:%d%s", r.Ports.MCP, guest.HealthPath)},
		Paths: vminfo.PathsInfo{Dir: l.Dir, Workspace: l.Workspace()},
		Agent: guestctl.Health{State: "unknown"},
		// The host's pins are every VM's: net show and doctor list them.
		Net: netpolicy.InfoOf(e, m.Contains(e.Record), nil),
	}
	if tok, err := l.ReadToken(); err == nil {
		info.MCP.Token = tok
	}
	d, err := m.driverOf(r)
	if err != nil {
		info.State, info.Detail = vminfo.StateInvalid, err.Error()
		return info
	}
	mach := m.machine(r, l)
	info.Paths.Workspace, info.Paths.WorkspaceHost = m.WorkspacePath(r, l)
	info.Paths.ConsoleLog = d.Logs(mach).Console
	live, err := d.Inspect(ctx, mach)
	if err != nil {
		info.State, info.Detail = vminfo.StateInvalid, err.Error()
		return info
	}
	info.State, info.Detail, info.Suspend, info.Pid = live.State, live.Detail, live.Suspend, live.Pid
	if lc := live.Launch; lc != nil {
		info.Accel, info.AccelReason, info.Share = lc.Accel, lc.AccelReason, string(lc.Share)
		if live.Alive() {
			started := lc.StartedAt
			info.StartedAt = &started
			info.UptimeSeconds = int64(live.Uptime(m.Now()).Seconds())
		}
	}
	// Booting until the start that launched it saw SSH answer; a VM whose
	// start gave up (or was started by an older agent-vm) is asked directly.
	if f, ok := m.Foreign(r); ok {
		info.Foreign, info.Ports, info.MCP = f.Config, state.Ports{}, vminfo.MCPInfo{}
		info.Accel, info.AccelReason, info.Share = "", "", "" // its configuration's, not agent-vm's
		info.SSH = vminfo.SSHInfo{Alias: sshconfig.Alias(r.Slug)}
		info.Agent = guestctl.Health{State: "none", Detail: f.Config + ", run as is, runs no agent-mcp"}
		return info
	}
	if live.State == vminfo.StateRunning && (live.Launch == nil || live.Launch.ReadyAt == nil) && !guestctl.SSHAnswers(ctx, r.Ports.SSH) {
		info.State = vminfo.StateStarting
	}
	switch {
	case withHealth && live.Alive():
		info.Agent = guestctl.CheckHealth(ctx, r.Ports.MCP)
	case live.State == vminfo.StateSuspended:
		// agent-mcp cannot answer: no guest code runs. Not asked, so a
		// paused VM is not taken for one whose agent-mcp hangs.
		info.Agent.Detail = "the VM is suspended; agent-mcp answers again after `agent-vm resume " + r.Slug + "`"
	}
	if live.Alive() {
		info.SSH.Held = m.guestOf(r, l).Held()
	}
	return info
}
