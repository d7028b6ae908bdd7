package debian

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/cloudinit"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vagrant"
	"github.com/agent-vm/agent-vm/internal/vagrantbox"
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
	// ImageDir holds the base images agent-vm's own box is made from.
	ImageDir string
	// Home is the vagrant driver's VAGRANT_HOME, where the box is added.
	Home string
	// Progress receives vagrant's output while the box is added.
	Progress io.Writer
}

var _ backend.Backend = (*VagrantBackend)(nil)

// VagrantSettings is this backend's section of the VM record.
type VagrantSettings struct {
	// Box is the Vagrant box of --box; "" (or vagrant.DefaultBox, in
	// records of earlier VMs) is agent-vm's own, made from its base image.
	Box string `json:"box,omitempty"`
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
	if err := r.SetSection(s); err != nil {
		return err
	}
	final := state.Layout{Dir: r.Paths.Dir}
	if final.Dir == "" {
		return fmt.Errorf("internal error: the VM's final directory is not known at provisioning")
	}
	boot := b.boot(final, r, s)
	if ownBox(s) {
		// The box as the next start will add it, when the image is there.
		boot.Box = "agent-vm/" + image.DefaultBuildName
		if img, err := image.Lookup(b.ImageDir, image.DefaultBuildName); err == nil {
			if box, err := vagrantbox.For(img); err == nil {
				boot.Box, boot.BoxVersion = box.Name, box.Version
			}
		}
	}
	v := vagrant.SpecOf(backend.MachineOf(r, final), boot, driver.StartOptions{Accel: "kvm", Share: driver.ShareVirtiofs}, vagrant.DefaultURI)
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
	sd := seedOf(r, s.Provision, MACOf(r.ID))
	sd.direct = true // the vagrant driver does not contain the network: no proxy door
	if err := writeSeed(ctx, l, r, sd, b.Executable, o.CACerts); err != nil {
		return nil, err
	}
	boot := b.boot(l, r, s)
	if ownBox(s) {
		box, err := b.addBox(ctx, o.Report)
		if err != nil {
			return nil, err
		}
		boot.Box, boot.BoxVersion = box.Name, box.Version
	}
	return &backend.Plan{Boot: boot, Settle: cloudinit.SettleCommand}, nil
}

// ownBox: the VM boots agent-vm's own box, not one of --box.
func ownBox(s VagrantSettings) bool { return s.Box == "" || s.Box == vagrant.DefaultBox }

// addBox adds agent-vm's own box, made from the default base image, to
// the driver's VAGRANT_HOME unless it is there, and checks that libvirt's
// QEMU can read the kernel it boots from there.
func (b *VagrantBackend) addBox(ctx context.Context, report backend.Reporter) (vagrantbox.Box, error) {
	img, err := image.Lookup(b.ImageDir, image.DefaultBuildName)
	if errors.Is(err, image.ErrNotFound) {
		return vagrantbox.Box{}, fmt.Errorf("there is no base image in %s to make the vagrant box from (hint: build it with `sudo agent-vm image build` (about 2 minutes), or create the VM with --box NAME)", b.ImageDir)
	}
	if err != nil {
		return vagrantbox.Box{}, err
	}
	box, err := vagrantbox.For(img)
	if err != nil {
		return vagrantbox.Box{}, err
	}
	if err := os.MkdirAll(b.Home, 0o755); err != nil {
		return vagrantbox.Box{}, fmt.Errorf("making VAGRANT_HOME %s: %w", b.Home, err)
	}
	if _, err := os.Stat(filepath.Join(box.Dir(b.Home), vagrantbox.MetadataFile)); err != nil {
		report.Report("adding the vagrant box "+box.String()+" (first start with this image, about a minute)", 0, "")
	}
	if box, err = vagrantbox.Add(ctx, img, vagrantbox.AddOptions{Run: b.Run, Home: b.Home, WorkDir: filepath.Dir(b.Home), Progress: b.Progress}); err != nil {
		return vagrantbox.Box{}, err
	}
	if err := vagrantbox.CheckQEMUCanRead(filepath.Join(box.Dir(b.Home), image.KernelFile)); err != nil {
		return vagrantbox.Box{}, fmt.Errorf("%w (VAGRANT_HOME is %s: set AGENT_VM_VAGRANT_HOME to a directory outside home directories, e.g. /var/lib/agent-vm/vagrant)", err, b.Home)
	}
	return box, nil
}

// Release implements backend.Backend: nothing outside the directory.
func (b *VagrantBackend) Release(state.Layout) error { return nil }

// ImagesInUse implements backend.Backend: boxes are vagrant's.
func (b *VagrantBackend) ImagesInUse(state.Layout) []string { return nil }
