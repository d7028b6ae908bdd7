package hostsetup

import (
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/vagrantbackend"
)

// setup --backend adds what the backend needs besides every VM's (the
// vagrant backend's programs), and refuses a backend this build lacks.
func TestSetupNeedPerBackend(t *testing.T) {
	h := &Host{Backends: map[string]backend.Backend{"qemu": &debian.Backend{}, "nixos": &nixos.Backend{}, "vagrant": &vagrantbackend.Backend{}}}
	base := hostpkgs.Run | hostpkgs.Image
	for name, want := range map[string]hostpkgs.Need{"": base, "auto": base, "qemu": base, "nixos": base, "vagrant": base | hostpkgs.Vagrant} {
		if got, err := h.need(false, name); err != nil || got != want {
			t.Errorf("--backend %q: got %v, %v; want %v", name, got, err, want)
		}
	}
	if got, _ := h.need(true, "vagrant"); got != base|hostpkgs.Vagrant|hostpkgs.Test {
		t.Errorf("--tests --backend vagrant: got %v", got)
	}
	if _, err := h.need(false, "docker"); err == nil || !strings.Contains(err.Error(), "must be auto, qemu, nixos, vagrant or libvirt") {
		t.Errorf("--backend docker: %v", err)
	}
}
