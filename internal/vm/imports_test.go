package vm

import (
	"maps"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestNoBackendOrDriverImported keeps both seams: vm runs machines through
// internal/driver and guests through internal/backend, and imports no
// driver or backend (every package with a compile-time check of
// driver.Driver or backend.Backend), nor what only they use; the
// composition root, internal/wire, builds them. Tests may reach them
// (fakes).
func TestNoBackendOrDriverImported(t *testing.T) {
	const module = "github.com/agent-vm/agent-vm/internal/"
	concrete := map[string]bool{module + "qemu": true, module + "qmp": true, module + "debian": true,
		module + "nixos": true, module + "cloudinit": true, module + "vagrant": true, module + "vagrantbackend": true,
		module + "vagrantbox": true, module + "seed": true, module + "virtiofsd": true, module + "sharejail": true,
		module + "libvirt": true, module + "libvirtbackend": true}
	pkgs := tu.Packages(t)
	impl := tu.Implementing(t, pkgs, "driver", "Driver")
	maps.Copy(impl, tu.Implementing(t, pkgs, "backend", "Backend"))
	if len(impl) < 5 {
		t.Fatalf("found %d drivers and backends: the check proves nothing", len(impl))
	}
	maps.Copy(concrete, impl)
	checked := 0
	for _, p := range pkgs {
		if p.ImportPath != module+"vm" {
			continue
		}
		for _, imp := range p.Imports {
			checked++
			if concrete[imp] {
				t.Errorf("internal/vm imports %s; use the contracts (internal/driver, internal/backend), and build drivers and backends in internal/wire", imp)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d of vm's imports: the check proves nothing", checked)
	}
}
