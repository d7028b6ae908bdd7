// Package state owns agent-vm's state directory: where each VM's files live
// (Layout), the versioned VM record (config.json), branch -> slug mapping,
// locks, atomic creation and removal, and which VM a name means (Find).
//
// The directory looks like this:
//
//	<root>/
//	  .locks/<slug>.lock                       flock files: one per VM, and
//	  .locks/.ports.lock, .locks/.sweep.lock   agent-vm's own (dot: no slug)
//	  .tmp/<slug>.<rand>/                      creates in progress
//	  .trash/<slug>.<rand>/                    removals in progress
//	  <slug>/                                  one VM (see Layout)
//
// Slugs never contain '.', so nothing agent-vm keeps for itself can collide
// with a VM directory.
package state

import "path/filepath"

// File and directory names inside a VM directory.
const (
	RecordFile     = "config.json"
	WorkspaceDir   = "workspace"
	SSHDir         = "ssh"
	ClientKeyFile  = "id_ed25519"
	KnownHostsFile = "known_hosts"
	SecretsDir     = "secrets"
	HostKeyFile    = "ssh_host_ed25519_key"
	MCPTokenFile   = "mcp-token"
	ProxyCAFile    = "proxy-ca.pem"     // the VM's CA (internal/egress): its certificate
	ProxyCAKeyFile = "proxy-ca-key.pem" // and its key
	RunDir         = "run"
	LogsDir        = "logs"
	NetDir         = "net" // the egress proxy's policy, log and asks (internal/netpolicy)
)

// Layout names the files of one VM directory.
type Layout struct{ Dir string }

func (l Layout) Record() string         { return filepath.Join(l.Dir, RecordFile) }
func (l Layout) Workspace() string      { return filepath.Join(l.Dir, WorkspaceDir) }
func (l Layout) SSHDir() string         { return filepath.Join(l.Dir, SSHDir) }
func (l Layout) ClientKey() string      { return filepath.Join(l.Dir, SSHDir, ClientKeyFile) }
func (l Layout) ClientPubKey() string   { return l.ClientKey() + ".pub" }
func (l Layout) KnownHosts() string     { return filepath.Join(l.Dir, SSHDir, KnownHostsFile) }
func (l Layout) SecretsDir() string     { return filepath.Join(l.Dir, SecretsDir) }
func (l Layout) HostKey() string        { return filepath.Join(l.Dir, SecretsDir, HostKeyFile) }
func (l Layout) HostPubKey() string     { return l.HostKey() + ".pub" }
func (l Layout) MCPToken() string       { return filepath.Join(l.Dir, SecretsDir, MCPTokenFile) }
func (l Layout) ProxyCA() string        { return filepath.Join(l.Dir, SecretsDir, ProxyCAFile) }
func (l Layout) ProxyCAKey() string     { return filepath.Join(l.Dir, SecretsDir, ProxyCAKeyFile) }
func (l Layout) RunDir() string         { return filepath.Join(l.Dir, RunDir) }
func (l Layout) NetDir() string         { return filepath.Join(l.Dir, NetDir) }
func (l Layout) LogsDir() string        { return filepath.Join(l.Dir, LogsDir) }
func (l Layout) Run(name string) string { return filepath.Join(l.Dir, RunDir, name) }
func (l Layout) Log(name string) string { return filepath.Join(l.Dir, LogsDir, name) }

// Paths returns the informational paths stored in the record.
func (l Layout) Paths() Paths {
	return Paths{Dir: l.Dir, Workspace: l.Workspace(), SSHKey: l.ClientKey(), KnownHosts: l.KnownHosts()}
}
