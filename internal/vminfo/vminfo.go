// Package vminfo is what agent-vm says of a VM: the states users see and
// the document `status --json` and `list --json` print (Info), whose
// field names are part of the documented output (docs/usage.md, "JSON
// output"). vm fills it in; cli prints it as JSON or text.
package vminfo

import (
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
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
	// SuspendHibernated: paused in place, its memory on disk; a connection
	// to it wakes it.
	SuspendHibernated = driver.SuspendHibernated
)

// Info is what `status --json` prints for one VM. Field names are part of
// the documented output (docs/usage.md, "JSON output"); every field is
// always present (empty, 0 or null when it does not apply), except net in
// an invalid record's and mcp.token in `list --json`.
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
