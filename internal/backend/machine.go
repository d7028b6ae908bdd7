package backend

import (
	"fmt"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/state"
)

// MachineOf describes the VM whose record is r and directory l to its
// driver, with the MCP token every guest gets (start adds the backend's
// own credentials). The orchestration and a backend that writes its
// driver's files at create (vagrant's Vagrantfile) describe it alike.
func MachineOf(r *state.Record, l state.Layout) driver.Machine {
	creds := []driver.Credential{{Name: guest.MCPTokenCredential, File: l.MCPToken()}}
	fwds := []driver.Forward{
		{Name: "ssh", Host: r.Ports.SSH, Guest: guest.SSHPort},
		{Name: "mcp", Host: r.Ports.MCP, Guest: guest.MCPPort},
	}
	for _, f := range r.Forwards {
		fwds = append(fwds, UserForward(f))
	}
	if r.Guest.Foreign != "" {
		// The user's own configuration (a repository's Vagrantfile) says
		// which ports it forwards; agent-vm forwards none and so checks
		// none at start.
		fwds = nil
	}
	return driver.Machine{
		Name: r.MachineName, UUID: r.ID, CPUs: r.Resources.CPUs, MemoryMiB: r.Resources.MemoryMiB,
		RunDir: l.RunDir(), LogsDir: l.LogsDir(),
		Share:       driver.Share{Source: l.Workspace(), Tag: guest.ShareTag, UID: r.Guest.UID, GID: r.Guest.GID, Cache: r.WorkspaceCache},
		Forwards:    fwds,
		Credentials: creds,
	}
}

// UserForward is one of the user's forwards (`agent-vm port`) as its
// driver sees it.
func UserForward(f state.Forward) driver.Forward {
	return driver.Forward{Name: fmt.Sprintf("forward of guest port %d", f.Guest), Host: f.Host, Guest: f.Guest}
}
