// Package cloudinit renders the NoCloud seed that turns a stock Debian (or
// Ubuntu) cloud-init guest into an agent-vm guest, and writes it as an ISO
// 9660 image labelled cidata.
//
// The seed implements the guest contract of docs/design.md: user dev with the
// workspace owner's uid/gid, passwordless sudo and the VM's SSH key; sshd
// key-only with the pinned host key; /workspace from virtiofs, else 9p; the
// agent-mcp unit running `agent-vm mcp-proxy` with the NixOS module's
// hardening; the MCP token read from QEMU fw_cfg at every boot.
//
// Every document is a typed struct marshalled to JSON (JSON is YAML, so
// "#cloud-config\n" + JSON is valid user-data). The guest's units and scripts
// are static files embedded from guest/; nothing from the Config is spliced
// into them. Values reach the guest only as JSON strings, as arguments, or in
// an environment file whose values are validated to plain characters.
//
// Boot cost: cloud-init's stages take ~20 s of every boot under TCG, so the
// first boot ends by creating /etc/cloud/cloud-init.disabled, and later boots
// skip cloud-init. The agent-vm units are enabled and do not need it. To
// provision again (a new InstanceID), either boot once with
// ReprovisionKernelArg on the kernel command line, or let the guest notice:
// agent-vm-setup.service compares the seed's instance-id with the one
// cloud-init provisioned, switches cloud-init back on and reboots once.
package cloudinit

import "github.com/agent-vm/agent-vm/internal/guest"

// Names the launcher and the guest agree on (the guest contract).
const (
	// UserName is the guest's login user (the guest contract's).
	UserName = guest.User
	// SeedLabel is the volume id of the seed ISO, which cloud-init's NoCloud
	// datasource and agent-vm-setup.service look for.
	SeedLabel = "cidata"
	// WorkspaceTag is the virtiofs tag (vhost-user-fs-pci tag=) and the 9p
	// mount tag (-virtfs mount_tag=) of the workspace share.
	WorkspaceTag = guest.ShareTag
	// WorkspaceDir is where the guest mounts the workspace.
	WorkspaceDir = guest.Workspace
	// NinePMountOptions are the options the guest mounts a 9p workspace with.
	NinePMountOptions = "trans=virtio,version=9p2000.L,msize=524288"
	// MCPTokenFwCfgName is the fw_cfg name under which QEMU must pass the MCP
	// token file: -fw_cfg name=<this>,file=<vm>/secrets/mcp-token. systemd
	// imports it as the system credential agent-vm.mcp-token.
	MCPTokenFwCfgName = "opt/io.systemd.credentials/" + guest.MCPTokenCredential
	// DefaultMCPPort is the port agent-mcp listens on in the guest.
	DefaultMCPPort = guest.MCPPort
	// MCPHealthPath answers GET without a token once agent-mcp is serving.
	MCPHealthPath = guest.HealthPath
	// DefaultMACAddress is QEMU's default MAC for the first NIC; the network
	// config matches the NIC by its MAC, so the launcher must give the
	// virtio-net device this MAC (or pass its own as Config.MACAddress).
	DefaultMACAddress = "52:54:00:12:34:56"
	// AgentBinaryName is the name of the agent-vm binary on the seed.
	AgentBinaryName = "agent-vm"
	// AgentDigestName is the name of the binary's SHA-256 (hex) on the
	// seed. The guest keeps the digest of the binary it installed and
	// reads the seed's 26 MB binary only when the two differ: comparing the
	// binaries byte for byte took most of the guest's setup at every boot
	// (seconds under TCG, on the path to SSH).
	AgentDigestName = "agent-vm.sha256"
	// ReprovisionKernelArg, on the kernel command line, makes cloud-init run
	// although the first boot switched it off (its systemd generator checks
	// the kernel command line before /etc/cloud/cloud-init.disabled). Pass it
	// on the first boot after changing InstanceID when booting a kernel
	// directly; it saves the reboot the guest otherwise does by itself.
	// Leave it off other boots: it costs cloud-init's ~20 s each time.
	ReprovisionKernelArg = "cloud-init=enabled"
	// SettleCommand is what start runs in the guest before it returns. The
	// agent is healthy well before cloud-init's first boot ends (runcmd,
	// then the switch-off above); until the guest flushes its page cache,
	// a kill of QEMU can leave host keys, users or that switch half
	// written. It waits for cloud-init (at once on later boots, where
	// cloud-init is disabled) and syncs, which needs no privilege.
	//
	// It waits as `cloud-init status --wait` does (cloud-init 22.4's
	// cmd/status.py), reading the same files: until this boot's stages
	// wrote their result, or cloud-init is off for this boot (its systemd
	// generator made no "enabled" file, or the switch-off exists and the
	// kernel command line does not override it). Not by running it: that
	// is a Python process importing cloud-init (3 s on an idle host under
	// TCG) that polls four times a second, about a sixth of a vCPU taken
	// from the first boot's own setup (npm installs) while it waits.
	SettleCommand = `while [ ! -e /run/cloud-init/result.json ] && [ -e /run/cloud-init/enabled ] && ` +
		`{ grep -qw ` + ReprovisionKernelArg + ` /proc/cmdline || [ ! -e ` + cloudInitDisabledFile + ` ]; }; do sleep 1; done; sync`
)

// AgentPackages returns the Debian packages the agent needs. The first boot
// installs whichever are missing; on agent-vm's own images (which must carry
// them) that is none, and costs no apt-get update.
func AgentPackages() []string { return []string{"git", "nodejs", "npm"} }

// Config is everything the seed says about one VM.
type Config struct {
	// InstanceID is cloud-init's instance-id. cloud-init provisions once per
	// instance-id: change it only to provision the VM again.
	InstanceID string
	// Hostname is the guest's hostname: one lowercase DNS label.
	Hostname string
	// UID and GID are dev's ids in the guest. virtiofs passes ids through, so
	// they must be the workspace owner's on the host (see docs/design.md,
	// "Workspace ownership"): uid 1000 or above, never 0.
	UID, GID int
	// AuthorizedKeys are authorized_keys lines (no options) that may log in
	// as dev.
	AuthorizedKeys []string
	// HostKey is the pinned ed25519 host key sshd presents.
	HostKey HostKey
	// MCP configures agent-mcp.
	MCP MCP
	// ExtraPackages are Debian packages installed on the first boot in
	// addition to AgentPackages (create --packages, the repository's
	// .agent-vm/config.toml), as the first step of the repository's
	// provisioning: a failure shows in its log and status.
	ExtraPackages []string
	// MACAddress is the MAC of the guest's virtio NIC; empty means
	// DefaultMACAddress.
	MACAddress string
	// NPMPackages are npm packages installed globally on the first boot,
	// after the Debian packages (the agent CLI of create --agent).
	NPMPackages []string
	// NPMPrograms are agents' program packages for the guest
	// (guest.Agent.Specs), installed globally after NPMPackages and linked
	// as their agents' commands (guest.NPMInstallPrograms).
	NPMPrograms []string
	// Guidance is the note that tells agents where they are
	// (guest.Guidance), written to each of guest.GuidanceFiles in dev's
	// home on the first boot. Empty writes none.
	Guidance string
	// CACerts are PEM CA certificates the guest trusts besides its own
	// bundle (the host's added ones, see internal/hostca), installed by
	// guest/ca-certs in bootcmd whenever cloud-init runs.
	CACerts []string
	// Template renders a template's seed (see clone.go): the guest
	// contract without the VM's own first-boot work (no guidance notes,
	// agent CLI or repository provisioning), which its clones do.
	Template bool
}

// HostKey is an ed25519 SSH host key pair, as ssh-keygen writes it. The
// private key is a secret: it reaches only the seed ISO (0600).
type HostKey struct {
	// Private is the unencrypted OpenSSH private key
	// ("-----BEGIN OPENSSH PRIVATE KEY-----...").
	Private string
	// Public is the matching public key line ("ssh-ed25519 AAAA... comment").
	Public string
}

// MCP configures the agent-mcp unit.
type MCP struct {
	// Port is the port agent-mcp listens on in the guest (all addresses; the
	// host forwards a 127.0.0.1 port to it). 0 means DefaultMCPPort.
	Port int
	// AllowOrigins are the browser origins the proxy accepts
	// (scheme://host[:port]), passed as --allow-origin.
	AllowOrigins []string
	// Config is the VM's own MCP configuration (Claude's mcpServers JSON),
	// used when the workspace has no .mcp.json. nil means no servers. It may
	// hold secrets (API keys in env): in the guest it is readable by root
	// and dev only.
	Config []byte
}

func (c Config) mcpPort() int {
	if c.MCP.Port == 0 {
		return DefaultMCPPort
	}
	return c.MCP.Port
}

func (c Config) macAddress() string {
	if c.MACAddress == "" {
		return DefaultMACAddress
	}
	return c.MACAddress
}
