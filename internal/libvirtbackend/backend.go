// Package libvirtbackend is the backend users call "libvirt": the Debian
// guest of the qemu backend, made an agent-vm guest by the same cloud-init
// seed (internal/seed), run by the libvirt driver (internal/libvirt) on
// this machine's system libvirtd: its root disk an overlay volume in
// agent-vm's storage pool on the base image uploaded there once, its
// network one of its own behind its egress proxy. It owns its section of
// the VM record (Settings). What it shares with the qemu and vagrant
// backends is in packages of their own (seed, cloudinit, image): no
// backend imports another.
package libvirtbackend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/cloudinit"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/libvirt"
	"github.com/agent-vm/agent-vm/internal/seed"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Name is the libvirt backend's name in VM records.
const Name = "libvirt"

// Backend is the Debian guest run by the libvirt driver.
type Backend struct {
	Run execx.Runner
	Log hclog.Logger
	// Executable is the agent-vm binary the guest runs as its MCP proxy.
	Executable func() (string, error)
	// ImageDir holds the base images.
	ImageDir string
	// BuildImage builds the default base image when there is none (as
	// root, the first start on a host); nil refuses with a hint.
	BuildImage func(ctx context.Context) (*image.Image, error)
}

var (
	_ backend.Backend            = (*Backend)(nil)
	_ backend.HostNeeder         = (*Backend)(nil)
	_ backend.GuestProgramLister = (*Backend)(nil)
)

// Settings is this backend's section of the VM record.
type Settings struct {
	// Image is the directory of the base image version the VM's root disk
	// was made on (its first start), which every later start boots: a
	// rebuilt image never changes what an existing VM boots.
	Image string `json:"image,omitempty"`
	// Provision counts re-provisioning requests (start --reprovision); the
	// guest's first-boot setup runs again whenever it changes.
	Provision int `json:"provision"`
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return Name }

// Driver is "libvirt".
func (b *Backend) Driver() string { return libvirt.DriverName }

// HostNeeds implements backend.HostNeeder: libvirt, its network's
// dnsmasq, nft.
func (b *Backend) HostNeeds() hostpkgs.Need { return hostpkgs.Run | hostpkgs.Image | hostpkgs.Libvirt }

// GuestPrograms implements backend.GuestProgramLister: the base image's,
// as the qemu backend's.
func (b *Backend) GuestPrograms() []string {
	return []string{"node", "npm", "npx", "python3", "curl"}
}

// Doctor implements backend.Backend: VMs boot from the base image.
func (b *Backend) Doctor(context.Context) backend.Readiness {
	var r backend.Readiness
	if img, err := image.Lookup(b.ImageDir, image.DefaultBuildName); err == nil {
		r.Ready = true
		r.Checks = append(r.Checks, backend.Check{Name: "base image", OK: true,
			Detail: fmt.Sprintf("%s (%s, built %s)", img.Disk, img.Name, img.Manifest.Created.Format("2006-01-02"))})
	} else {
		r.Ready = b.BuildImage != nil
		r.Checks = append(r.Checks, backend.Check{Name: "base image", OK: r.Ready, Detail: "none in " + b.ImageDir,
			Hint: "build it: `sudo agent-vm image build` (about 2 minutes)"})
	}
	return r
}

// CheckCreate implements backend.Backend.
func (b *Backend) CheckCreate(f backend.CreateFlags) error {
	why := " (hint: drop it; the libvirt backend boots agent-vm's Debian base image)"
	switch {
	case f.Image != "":
		return errors.New("--image chooses the qemu backend's base disk; the libvirt backend boots agent-vm's own base image, uploaded to libvirt's storage pool" + why)
	case f.Config != "" || f.Nixpkgs != "":
		return errors.New("--config and --nixpkgs belong to the nixos backend" + why)
	case f.Box != "":
		return errors.New("--box chooses the vagrant backend's box" + why)
	case f.Vagrantfile != "" && f.Vagrantfile != "auto":
		return errors.New("--vagrantfile chooses the vagrant backend's Vagrantfile" + why)
	}
	return cloudinit.CheckPackages(f.Packages)
}

// Provision implements backend.Backend: its section; the disk is made in
// the pool at the first start.
func (b *Backend) Provision(_ context.Context, _ state.Layout, r *state.Record, _ backend.CreateFlags) error {
	return r.SetSection(Settings{})
}

// Reset implements backend.Backend: the root volume went with the
// driver's Destroy (vm.Reset); the next start makes it afresh on the
// default image as it is now, and cloud-init provisions it under a new
// instance-id.
func (b *Backend) Reset(_ context.Context, _ state.Layout, r *state.Record) error {
	if _, err := image.Lookup(b.ImageDir, image.DefaultBuildName); err != nil && b.BuildImage == nil {
		return fmt.Errorf("cannot reset VM %q: there is no base image in %s to make a fresh disk from: %w (hint: build it with `sudo agent-vm image build`; the VM is unchanged)", r.Branch, b.ImageDir, err)
	}
	s, err := state.SectionOf[Settings](r)
	if err != nil {
		return err
	}
	s.Image = ""
	s.Provision++
	return r.SetSection(s)
}

// CheckStart implements backend.Backend.
func (b *Backend) CheckStart(r *state.Record, f backend.StartFlags) error {
	if f.Nixpkgs != "" {
		return fmt.Errorf("--nixpkgs chooses the nixpkgs a nixos VM is built from; VM %q uses the libvirt backend (hint: drop --nixpkgs)", r.Branch)
	}
	return nil
}

// Prepare implements backend.Backend: a fresh seed, and the plan with the
// base image the VM's disk is made on.
func (b *Backend) Prepare(ctx context.Context, l state.Layout, r *state.Record, o backend.PrepareOptions) (*backend.Plan, error) {
	s, err := seed.ForStart(r, o.Reprovision, func(s *Settings) *int { return &s.Provision })
	if err != nil {
		return nil, err
	}
	img, err := b.image(ctx, r, s, o)
	if err != nil {
		return nil, err
	}
	if s.Image != img.Dir {
		s.Image = img.Dir
		if err := r.SetSection(s); err != nil {
			return nil, err
		}
	}
	c, err := seed.Config(l, r, s.Provision, o.CACerts)
	if err != nil {
		return nil, err
	}
	c.MACAddress = seed.MACOf(r.ID)
	if err := seed.Write(ctx, l, r, c, b.Executable); err != nil {
		return nil, err
	}
	cmdline := img.Cmdline
	if o.Reprovision {
		cmdline = strings.TrimSpace(cmdline + " " + cloudinit.ReprovisionKernelArg)
	}
	boot := libvirt.Boot{
		Image: libvirt.Image{Version: img.Name + "-" + filepath.Base(img.Dir), Disk: img.Disk, Format: img.Format,
			Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: cmdline},
		DiskBytes: uint64(r.Resources.DiskGiB) << 30,
		Seed:      filepath.Join(l.Dir, seed.File),
		MAC:       seed.MACOf(r.ID),
	}
	setup, err := cloudinit.Setup(cloudinit.SetupConfig{CACerts: o.CACerts, Placeholders: o.Placeholders, GitCredentials: o.GitCredentials})
	if err != nil {
		return nil, err
	}
	return &backend.Plan{Boot: boot, Settle: cloudinit.SettleCommand, SetupLog: guest.FirstBootLog, Setup: setup}, nil
}

// image is the base image the VM boots: the version its disk was made on,
// else the default image (built now when the host can).
func (b *Backend) image(ctx context.Context, r *state.Record, s Settings, o backend.PrepareOptions) (*image.Image, error) {
	if s.Image != "" {
		img, err := image.Open(s.Image)
		if err != nil {
			return nil, fmt.Errorf("the base image VM %q's disk was made on (%s) is gone: %w (hint: `agent-vm reset %s` makes its disk afresh on the current image; the workspace is kept)", r.Branch, s.Image, err, r.Slug)
		}
		return img, nil
	}
	img, err := image.Lookup(b.ImageDir, image.DefaultBuildName)
	if errors.Is(err, image.ErrNotFound) && b.BuildImage != nil {
		o.Report.Report("building the base image (first start on this host, about 2 minutes)", 0, "")
		img, err = b.BuildImage(ctx)
	}
	if errors.Is(err, image.ErrNotFound) {
		return nil, fmt.Errorf("there is no base image in %s (hint: build it with `sudo agent-vm image build`, about 2 minutes)", b.ImageDir)
	}
	if err != nil {
		return nil, err
	}
	if int64(r.Resources.DiskGiB)<<30 < img.Manifest.VirtualSizeBytes {
		return nil, fmt.Errorf("VM %q's disk (%d GiB) is smaller than the base image (%d bytes) (hint: destroy it and create it again with a larger --disk)", r.Branch, r.Resources.DiskGiB, img.Manifest.VirtualSizeBytes)
	}
	_, err = os.Stat(img.Disk)
	return img, err
}

// Release implements backend.Backend: nothing outside the directory (the
// driver's Destroy removed the volumes).
func (b *Backend) Release(state.Layout) error { return nil }

// ImagesInUse implements backend.Backend: the cached image version the
// VM's disk was made on (its disk is backed by that version's volume in
// libvirt's pool; a start uploads the version's kernel and initrd from the
// cache when the pool lacks them), none before its first start.
func (b *Backend) ImagesInUse(l state.Layout) []string {
	r, err := state.ReadRecord(l.Record())
	if err != nil {
		return nil
	}
	s, err := state.SectionOf[Settings](r)
	if err != nil || s.Image == "" {
		return nil
	}
	img, err := image.Open(s.Image)
	if err != nil {
		return nil
	}
	return []string{img.Disk}
}
