package vm

import (
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/vagrantbackend"
)

// mcp sync keeps a server whose command the guest has: every guest has
// sh, bash and git; the qemu backend's image has node and python3 too, the
// NixOS and vagrant guests (and a backend this build lacks) are not known
// to.
func TestGuestProgramsPerBackend(t *testing.T) {
	m := New(nil, nil, nil, nil, &debian.Backend{}, &nixos.Backend{}, &vagrantbackend.Backend{})
	for name, want := range map[string]string{
		"qemu":    "sh bash git node npm npx python3 curl",
		"nixos":   "sh bash git",
		"vagrant": "sh bash git",
		"docker":  "sh bash git",
	} {
		if got := strings.Join(m.GuestPrograms(name), " "); got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
}
