// Package guest is the guest contract: what every agent-vm guest provides,
// whichever backend made it, and what the host side relies on. The
// cloud-init renderer (internal/cloudinit), the NixOS renderer
// (internal/nixos, whose modules/guest.nix spells the same values, checked
// by this package's test) and the orchestration (internal/vm) all read it
// here, so they cannot drift apart.
package guest

const (
	// User is the guest's login user; it runs the agent and agent-mcp.
	User = "dev"
	// RootOwnerID is the uid/gid User gets when the workspace's owner on
	// the host is root (User cannot be uid 0).
	RootOwnerID = 1000
	// Workspace is where the guest mounts the workspace.
	Workspace = "/workspace"
	// ShareTag is the virtiofs tag and the 9p mount tag of the workspace.
	ShareTag = "workspace"
	// SSHPort is the guest's sshd port (forwarded from a host port).
	SSHPort = 22
	// MCPPort is the port agent-mcp listens on in the guest.
	MCPPort = 8000
	// HealthPath answers GET without a token once agent-mcp is serving.
	HealthPath = "/health"
	// MCPTokenCredential is the systemd credential that carries agent-mcp's
	// bearer token into the guest (passed by QEMU as fw_cfg
	// opt/io.systemd.credentials/<name>).
	MCPTokenCredential = "agent-vm.mcp-token"
	// HostKeyCredential carries a NixOS guest's SSH host key (never in the
	// Nix store).
	HostKeyCredential = "agent-vm.ssh-host-key"
)
