package vm

import (
	"fmt"
	"os"
	"strings"

	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/state"
)

// machine describes a VM to the launcher. extra adds a backend's own
// credentials to the MCP token every guest gets.
func (m *Manager) machine(r *state.Record, l state.Layout, extra []qemu.Credential) (qemu.Machine, error) {
	sock := qemu.SocketDirFor(l.RunDir(), r.ID)
	creds := append([]qemu.Credential{{Name: TokenCredName, File: l.MCPToken()}}, extra...)
	return qemu.Machine{
		Name: r.VMName, UUID: r.ID, CPUs: r.Resources.CPUs, MemoryMiB: r.Resources.MemoryMiB,
		RunDir: l.RunDir(), LogsDir: l.LogsDir(), SocketDir: sock,
		Share: qemu.Share{Source: l.Workspace(), Tag: ShareTag},
		Forwards: []qemu.Forward{
			{Name: "ssh", Host: r.Ports.SSH, Guest: GuestSSHPort},
			{Name: "mcp", Host: r.Ports.MCP, Guest: GuestMCPPort},
		},
		Credentials: creds,
	}, nil
}

// unrecordedMachine describes the VM of a directory whose record is
// unreadable from that directory alone: no uuid, no size, no ports. Enough
// for qemu.Adopt to find its QEMU and for Stop to end it.
func unrecordedMachine(e state.Entry) qemu.Machine {
	l := e.Layout
	return qemu.Machine{Name: "agent-vm-" + e.Slug, RunDir: l.RunDir(), LogsDir: l.LogsDir(), SocketDir: l.RunDir(),
		Share: qemu.Share{Source: l.Workspace(), Tag: ShareTag}}
}

// readToken reads the VM's MCP bearer token.
func readToken(l state.Layout) (string, error) {
	b, err := os.ReadFile(l.MCPToken())
	if err != nil {
		return "", fmt.Errorf("reading the MCP token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
