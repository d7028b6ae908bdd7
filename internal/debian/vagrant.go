package debian

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/cloudinit"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vagrant"
)

// VagrantName is the vagrant backend's name in VM records: the same Debian
// guest and cloud-init seed as the qemu backend, run by vagrant
// (vagrant-libvirt) from a box (see internal/vagrant's package doc).
const VagrantName = "vagrant"

// VagrantBackend is the Debian guest run by the Vagrant driver.
type VagrantBackend struct {
	Run execx.Runner
	Log hclog.Logger
	// Executable is the agent-vm binary the guest runs as its MCP proxy.
	Executable func() (string, error)
}

var _ backend.Backend = (*VagrantBackend)(nil)

// VagrantSettings is this backend's section of the VM record.
type VagrantSettings struct {
	// Box is the Vagrant box (--box; vagrant.DefaultBox when not given).
	Box string `json:"box"`
	// Provision counts re-provisioning requests, as Settings.Provision.
	Provision int `json:"provision"`
}

// Name implements backend.Backend.
func (b *VagrantBackend) Name() string { return VagrantName }

// Driver is "vagrant".
func (b *VagrantBackend) Driver() string { return vagrant.DriverName }

// Doctor implements backend.Backend: the driver checks vagrant, its
// plugin and libvirt; the box is added on the first `vagrant up`.
func (b *VagrantBackend) Doctor(context.Context) backend.Readiness {
	return backend.Readiness{Ready: true}
}

// CheckCreate implements backend.Backend.
func (b *VagrantBackend) CheckCreate(f backend.CreateFlags) error {
	switch {
	case f.Image != "":
		return fmt.Errorf("--image sets the base disk image of the qemu backend; the vagrant backend boots a box (hint: use --box NAME, or pass --backend qemu)")
	case f.Config != "" || f.Nixpkgs != "":
		return fmt.Errorf("--config and --nixpkgs belong to the nixos backend; the vagrant backend boots a Debian box (hint: drop them, or pass --backend nixos)")
	case strings.ContainsAny(f.Box, "\x00\n\r") || strings.TrimSpace(f.Box) != f.Box:
		return fmt.Errorf("--box %q is not a box name (hint: a name such as debian/bookworm64, as `vagrant box list` shows)", f.Box)
	}
	return cloudinit.CheckPackages(f.Packages)
}

// ErrOwnVagrantfile: the repository has a Vagrantfile of its own, which
// agent-vm does not use yet (issue 15, item 2).
var ErrOwnVagrantfile = errors.New("the repository has its own Vagrantfile")

// Provision implements backend.Backend: it records the box and writes the
// Vagrantfile into the VM's run directory (never into the workspace), with
// the paths the VM will have once created (r.Paths.Dir) and KVM; every
// start writes it again for its accelerator and share.
func (b *VagrantBackend) Provision(_ context.Context, l state.Layout, r *state.Record, f backend.CreateFlags) error {
	if _, err := os.Lstat(filepath.Join(l.Workspace(), "Vagrantfile")); err == nil {
		return fmt.Errorf("%w at its root: using it is not supported yet, and agent-vm never overwrites it (hint: create this VM with --backend qemu for now)", ErrOwnVagrantfile)
	}
	s := VagrantSettings{Box: f.Box}
	if s.Box == "" {
		s.Box = vagrant.DefaultBox
	}
	if err := r.SetSection(s); err != nil {
		return err
	}
	final := state.Layout{Dir: r.Paths.Dir}
	if final.Dir == "" {
		return fmt.Errorf("internal error: the VM's final directory is not known at provisioning")
	}
	v := vagrant.SpecOf(backend.MachineOf(r, final), b.boot(final, r, s), driver.StartOptions{Accel: "kvm", Share: driver.ShareVirtiofs}, vagrant.DefaultURI)
	return vagrant.Write(l.RunDir(), v)
}

// boot is the plan: the box, the seed, the NIC's MAC, the SSH login.
func (b *VagrantBackend) boot(l state.Layout, r *state.Record, s VagrantSettings) vagrant.Boot {
	return vagrant.Boot{Box: s.Box, Seed: filepath.Join(l.Dir, SeedFile), MAC: MACOf(r.ID), SSHUser: r.Guest.User, SSHKey: l.ClientKey()}
}

// MACOf is the VM's own MAC on libvirt's shared network (52:54:00 is
// QEMU's prefix), from its id: the seed's network config matches the NIC
// by it, and two VMs on one network must not share one.
func MACOf(id string) string {
	h := sha256.Sum256([]byte(id))
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", h[0], h[1], h[2])
}

// Reset implements backend.Backend: vagrant owns the disk, so a reset is
// `agent-vm destroy` and create for now.
func (b *VagrantBackend) Reset(_ context.Context, _ state.Layout, r *state.Record) error {
	return fmt.Errorf("cannot reset VM %q: the vagrant backend cannot reset a VM yet (hint: destroy it and create it again; the VM is unchanged)", r.Branch)
}

// CheckStart implements backend.Backend.
func (b *VagrantBackend) CheckStart(r *state.Record, f backend.StartFlags) error {
	if f.Nixpkgs != "" {
		return fmt.Errorf("--nixpkgs chooses the nixpkgs a nixos VM is built from; VM %q uses the vagrant backend (hint: drop --nixpkgs)", r.Branch)
	}
	return nil
}

// Prepare implements backend.Backend: a fresh seed, and the plan.
func (b *VagrantBackend) Prepare(ctx context.Context, l state.Layout, r *state.Record, o backend.PrepareOptions) (*backend.Plan, error) {
	s, err := sectionForStart(r, o.Reprovision, func(s *VagrantSettings) *int { return &s.Provision })
	if err != nil {
		return nil, err
	}
	if err := writeSeed(ctx, l, r, seedOf(r, s.Provision, MACOf(r.ID)), b.Executable, o.CACerts); err != nil {
		return nil, err
	}
	return &backend.Plan{Boot: b.boot(l, r, s), Settle: cloudinit.SettleCommand}, nil
}

// Release implements backend.Backend: nothing outside the directory.
func (b *VagrantBackend) Release(state.Layout) error { return nil }

// ImagesInUse implements backend.Backend: boxes are vagrant's.
func (b *VagrantBackend) ImagesInUse(state.Layout) []string { return nil }
