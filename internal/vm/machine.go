package vm

import (
	"fmt"
	"os"
	"strings"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/state"
)

// machine describes a VM to its driver, with the MCP token every guest
// gets (start adds the backend's own credentials).
func (m *Manager) machine(r *state.Record, l state.Layout) driver.Machine {
	creds := []driver.Credential{{Name: guest.MCPTokenCredential, File: l.MCPToken()}}
	fwds := []driver.Forward{
		{Name: "ssh", Host: r.Ports.SSH, Guest: guest.SSHPort},
		{Name: "mcp", Host: r.Ports.MCP, Guest: guest.MCPPort},
	}
	for _, f := range r.Forwards {
		fwds = append(fwds, userForward(f))
	}
	return driver.Machine{
		Name: r.VMName, UUID: r.ID, CPUs: r.Resources.CPUs, MemoryMiB: r.Resources.MemoryMiB,
		RunDir: l.RunDir(), LogsDir: l.LogsDir(),
		Share:       driver.Share{Source: l.Workspace(), Tag: guest.ShareTag, UID: r.Guest.UID, GID: r.Guest.GID, Cache: r.WorkspaceCache},
		Forwards:    fwds,
		Credentials: creds,
	}
}

// userForward is one of the user's forwards (`agent-vm port`) as its
// driver sees it.
func userForward(f state.Forward) driver.Forward {
	return driver.Forward{Name: fmt.Sprintf("forward of guest port %d", f.Guest), Host: f.Host, Guest: f.Guest}
}

// unrecordedMachine describes the VM of a directory whose record is
// unreadable from that directory alone: no uuid, no size, no ports. Enough
// for the driver's Adopt to find it and for Stop to end it.
func unrecordedMachine(e state.Entry) driver.Machine {
	l := e.Layout
	return driver.Machine{Name: "agent-vm-" + e.Slug, RunDir: l.RunDir(), LogsDir: l.LogsDir(),
		Share: driver.Share{Source: l.Workspace(), Tag: guest.ShareTag}}
}

// readToken reads the VM's MCP bearer token.
func readToken(l state.Layout) (string, error) {
	b, err := os.ReadFile(l.MCPToken())
	if err != nil {
		return "", fmt.Errorf("reading the MCP token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
