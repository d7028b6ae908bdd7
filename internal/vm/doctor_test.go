package vm_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// TestDoctorOnANixOSHost: a NixOS host (FAKE at the exec boundary: it has
// git, QEMU and nix 2.24, answers their --version, and no Debian image) can
// run VMs with the nixos backend, which needs no image; the qemu backend's
// missing image is reported, not taken for the host's verdict.
func TestDoctorOnANixOSHost(t *testing.T) {
	fake := execxtest.New(t)
	for name, version := range map[string]string{"git": "git version 2.47.1", "qemu-system-x86_64": "QEMU emulator version 9.2.0",
		"qemu-img": "qemu-img version 9.2.0", "nix": "nix (Nix) 2.24.10"} {
		fake.Installed(name, "/run/current-system/sw/bin/"+name)
		fake.On(name, func(execxtest.Call) execxtest.Reply { return execxtest.Reply{Stdout: version + "\n"} })
	}
	root, err := state.Open(hostdir.StateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	launcher, err := qemu.NewLauncher(fake, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	d := qemu.NewDriver(launcher)
	d.FindVirtiofsd = func(context.Context) (*virtiofsd.Binary, error) { return nil, errors.New("none") }
	m := vm.New(root, fake, hclog.NewNullLogger(), []driver.Driver{d},
		&debian.Backend{Run: fake, ImageDir: t.TempDir()},
		&nixos.Backend{Run: fake, Log: hclog.NewNullLogger(), Getenv: func(string) string { return "" }})
	m.IsNixOS = func() bool { return true }
	m.Accel = func(context.Context) accel.Result { return accel.Result{Accel: accel.TCG, Reason: "test"} }

	r := m.Host.Doctor(context.Background())
	if !r.VMReady || r.Backend != "nixos" || !slices.Equal(r.Backends, []string{"nixos"}) {
		t.Errorf("doctor on NixOS with nix and no image: ready %v, backend %q, backends %v; want ready with nixos\n%+v", r.VMReady, r.Backend, r.Backends, r.Checks)
	}
	var imageCheck *hostsetup.Check
	for i, c := range r.Checks {
		if c.Name == "base image" {
			imageCheck = &r.Checks[i]
		}
	}
	if imageCheck == nil || imageCheck.OK {
		t.Errorf("the qemu backend's missing image is not reported: %+v", r.Checks)
	}
}
