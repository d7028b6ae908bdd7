package vm

import (
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/state"
)

// A Debian guest set up before containment is told to reset; one set up
// since, and NixOS guests (configured at every start), are not.
func TestProxyUnsetWarnsOnlyOldDebianGuests(t *testing.T) {
	m := New(nil, nil, nil, nil, &debian.Backend{}, &nixos.Backend{})
	old := &state.Record{Branch: "feat/x", Slug: "feat-x", Backend: BackendQEMU, Guest: state.Guest{User: "dev"}}
	if w := m.startWarning(old); !strings.Contains(w, "not configured for the egress proxy") || !strings.Contains(w, "`agent-vm reset feat-x`") {
		t.Errorf("old guest: %q", w)
	}
	for _, r := range []*state.Record{
		{Slug: "a", Backend: BackendQEMU, Guest: state.Guest{Proxy: true}},
		{Slug: "b", Backend: BackendNixOS},
	} {
		if w := m.startWarning(r); w != "" {
			t.Errorf("%s: %q", r.Slug, w)
		}
	}
}
