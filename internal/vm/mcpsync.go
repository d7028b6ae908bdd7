package vm

import "github.com/agent-vm/agent-vm/internal/backend"

// MCP sync is internal/mcpsync's; it asks the Manager which programs a
// guest has.

// GuestPrograms are the programs an MCP server may run in a guest of the
// backend named: every guest's, and what its backend lists
// (backend.GuestProgramLister: the Debian image's; a NixOS guest has what
// its configuration adds, git only by default).
func (m *Manager) GuestPrograms(name string) []string {
	base := []string{"sh", "bash", "git"}
	if l, ok := m.Backends[name].(backend.GuestProgramLister); ok {
		return append(base, l.GuestPrograms()...)
	}
	return base
}
