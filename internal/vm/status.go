package vm

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/sshconfig"
	"github.com/agent-vm/agent-vm/internal/state"
)

// VM states as users see them: the driver's states plus "starting"
// (QEMU runs, the guest's sshd does not answer yet) and "invalid" (the
// record cannot be read).
const (
	StateStopped  = driver.StateStopped
	StateStarting = "starting"
	StateRunning  = driver.StateRunning
	StatePaused   = driver.StatePaused
	StateCrashed  = driver.StateCrashed
	// StateSuspended: the VM's memory is kept and resume continues it;
	// Info.Suspend says how.
	StateSuspended = driver.StateSuspended
	StateInvalid   = "invalid"
)

// How a suspended VM keeps its memory (Info.Suspend).
const (
	SuspendPaused = driver.SuspendPaused
	SuspendSaved  = driver.SuspendSaved
)

// Info is what `status --json` prints for one VM. Field names are part of
// the documented output (docs/usage.md, "JSON output"); every field is always
// present (empty, 0 or null when it does not apply), except mcp.token in
// `list --json`.
type Info struct {
	Branch  string `json:"branch"`
	Slug    string `json:"slug"`
	Backend string `json:"backend"`
	// Host is the registered libvirt host the VM was placed on (create
	// --host), "" for this machine.
	Host   string `json:"host"`
	State  string `json:"state"`
	Detail string `json:"detail"`
	// Suspend says how a suspended VM keeps its memory: SuspendPaused
	// (in place, its QEMU holding it in host RAM) or SuspendSaved (on
	// disk); "" in every other state.
	Suspend     string          `json:"suspend"`
	CreatedAt   time.Time       `json:"created_at"`
	Ports       state.Ports     `json:"ports"`
	Forwards    []state.Forward `json:"forwards"` // the user's own (`agent-vm port`)
	Resources   state.Resources `json:"resources"`
	Accel       string          `json:"accel"`
	AccelReason string          `json:"accel_reason"`
	Share       string          `json:"share"`
	// ShareCache is the workspace's cache mode (driver.ShareCache*) as
	// recorded: the one the next start uses, virtiofs only.
	ShareCache    string          `json:"share_cache"`
	Pid           int             `json:"pid"`
	StartedAt     *time.Time      `json:"started_at"`
	UptimeSeconds int64           `json:"uptime_seconds"`
	Agent         guestctl.Health `json:"agent"`
	SSH           SSHInfo         `json:"ssh"`
	MCP           MCPInfo         `json:"mcp"`
	Paths         PathsInfo       `json:"paths"`
	Git           state.Git       `json:"git"`
	HostCA        bool            `json:"host_ca"`       // the guest trusts the host's added CA certificates
	AgentCLI      string          `json:"agent_cli"`     // create --agent, "" for none
	Net           *netpolicy.Info `json:"net,omitempty"` // the egress policy and exposed host ports
	// Secrets name the secrets whose placeholders the guest holds (from
	// its last start): the egress proxy adds their values (internal/secret).
	Secrets []string `json:"secrets"`
	// Foreign is the user's own configuration the guest runs as is (the
	// repository's Vagrantfile), "" for agent-vm's own guest. Such a VM has
	// no agent-mcp and no pinned host key: its ports, ssh and mcp fields
	// are empty, and `agent-vm ssh-config` prints vagrant's way in.
	Foreign string `json:"foreign"`
	Error   string `json:"error"` // set for invalid records
}

// SSHInfo says how to reach the VM over SSH.
type SSHInfo struct {
	Host           string `json:"host"`
	Port           int    `json:"port"`
	User           string `json:"user"`
	IdentityFile   string `json:"identity_file"`
	KnownHostsFile string `json:"known_hosts_file"`
	Alias          string `json:"alias"` // the Host name in `agent-vm ssh-config`
	// Held is the unix socket of the VM's held connection when its holder
	// runs (commands reach the guest through it), else "".
	Held string `json:"held"`
}

// MCPInfo says how to reach agent-mcp from the host.
type MCPInfo struct {
	URL    string `json:"url"`
	Health string `json:"health_url"`
	Token  string `json:"token,omitempty"`
}

// PathsInfo are the VM's files on the host.
type PathsInfo struct {
	Dir       string `json:"dir"`
	Workspace string `json:"workspace"`
	// WorkspaceHost names the host Workspace is a path on, for a VM
	// placed on another machine; "" for this one.
	WorkspaceHost string `json:"workspace_host,omitempty"`
	ConsoleLog    string `json:"console_log"`
}

// Status reads a VM's record and live state. withHealth also asks agent-mcp
// for /health (one HTTP request through the forwarded port).
func (m *Manager) Status(ctx context.Context, e state.Entry, withHealth bool) Info {
	if e.Record == nil {
		return Info{Slug: e.Slug, State: StateInvalid, Error: e.Err.Error(), Forwards: []state.Forward{}, Paths: PathsInfo{Dir: e.Layout.Dir}}
	}
	r, l := e.Record, e.Layout
	info := Info{
		Branch: r.Branch, Slug: r.Slug, Backend: r.Backend, Host: r.Host, CreatedAt: r.CreatedAt,
		Ports: r.Ports, Forwards: r.ForwardList(), ShareCache: driver.Share{Cache: r.WorkspaceCache}.CacheMode(), Resources: r.Resources, Git: r.Git, HostCA: !r.NoHostCA, AgentCLI: r.Agent, Secrets: append([]string{}, slices.Sorted(maps.Keys(r.Placeholders))...),
		SSH: SSHInfo{Host: "127.0.0.1", Port: r.Ports.SSH, User: r.Guest.User, IdentityFile: l.ClientKey(),
			KnownHostsFile: l.KnownHosts(), Alias: sshconfig.Alias(r.Slug)},
		MCP:   MCPInfo{URL: fmt.Sprintf("http://127.0.0.1:%d/mcp", r.Ports.MCP), Health: fmt.Sprintf("http://127.0.0.1:%d%s", r.Ports.MCP, guest.HealthPath)},
		Paths: PathsInfo{Dir: l.Dir, Workspace: l.Workspace()},
		Agent: guestctl.Health{State: "unknown"},
		// The host's pins are every VM's: net show and doctor list them.
		Net: netpolicy.InfoOf(e, m.Contains(e.Record), nil),
	}
	if tok, err := readToken(l); err == nil {
		info.MCP.Token = tok
	}
	d, err := m.driverOf(r)
	if err != nil {
		info.State, info.Detail = StateInvalid, err.Error()
		return info
	}
	mach := m.machine(r, l)
	info.Paths.Workspace, info.Paths.WorkspaceHost = m.WorkspacePath(r, l)
	info.Paths.ConsoleLog = d.Logs(mach).Console
	live, err := d.Inspect(ctx, mach)
	if err != nil {
		info.State, info.Detail = StateInvalid, err.Error()
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
		info.Foreign, info.Ports, info.MCP = f.Config, state.Ports{}, MCPInfo{}
		info.Accel, info.AccelReason, info.Share = "", "", "" // its configuration's, not agent-vm's
		info.SSH = SSHInfo{Alias: sshconfig.Alias(r.Slug)}
		info.Agent = guestctl.Health{State: "none", Detail: f.Config + ", run as is, runs no agent-mcp"}
		return info
	}
	if live.State == StateRunning && (live.Launch == nil || live.Launch.ReadyAt == nil) && !guestctl.SSHAnswers(ctx, r.Ports.SSH) {
		info.State = StateStarting
	}
	switch {
	case withHealth && live.Alive():
		info.Agent = guestctl.CheckHealth(ctx, r.Ports.MCP)
	case live.State == StateSuspended:
		// agent-mcp cannot answer: no guest code runs. Not asked, so a
		// paused VM is not taken for one whose agent-mcp hangs.
		info.Agent.Detail = "the VM is suspended; agent-mcp answers again after `agent-vm resume " + r.Slug + "`"
	}
	if live.Alive() {
		info.SSH.Held = m.guestOf(r, l).Held()
	}
	return info
}
