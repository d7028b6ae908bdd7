package vm

import (
	"fmt"
	"os"
	"strings"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/state"
)

// machine describes a VM to its driver (backend.MachineOf).
func (m *Manager) machine(r *state.Record, l state.Layout) driver.Machine {
	return backend.MachineOf(r, l)
}

// unrecordedMachine describes the VM of a directory whose record is
// unreadable from that directory alone: no uuid, no size, no ports. Enough
// for the driver's Adopt (driver.Adopter) to find it and for Stop to end
// it.
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
