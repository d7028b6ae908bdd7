// Package debian is the backend users call "qemu": a Debian (or Ubuntu)
// cloud image, booted by the QEMU launcher on its own overlay, made an
// agent-vm guest by a cloud-init NoCloud seed (internal/seed makes it from
// the VM, internal/cloudinit renders it; the vagrant backend,
// internal/vagrantbackend, boots the same seed). It owns its section of
// the VM record (Settings) and its files in the VM directory.
package debian

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/cloudinit"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/seed"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Name is the backend's name in VM records: a Debian (or Ubuntu) guest run
// by QEMU directly and configured with cloud-init.
const Name = "qemu"

// Files of the qemu backend in a VM directory.
const (
	DiskFile     = "disk.qcow2"   // the VM's overlay on the base image
	DiskInfoFile = "disk.json"    // what the overlay was made from
	SeedFile     = seed.File      // the NoCloud seed, rewritten at every start
	MCPConfig    = seed.MCPConfig // the VM's own MCP servers (optional)
	AdoptDir     = "adopt"        // a fork's: the keys of the VM its disk was copied from (Settings.Adopt)
)

// Backend boots cloud-init guests with the shared QEMU launcher.
type Backend struct {
	Run execx.Runner
	Log hclog.Logger
	// ImageDir is the image cache (image.DefaultCacheDir's layout).
	ImageDir string
	// Executable is the agent-vm binary the guest runs as its MCP proxy.
	Executable func() (string, error)
	// BuildImage builds the default base image when there is none; nil
	// means the user must build it.
	BuildImage func(ctx context.Context) (*image.Image, error)
}

var (
	_ backend.Backend            = (*Backend)(nil)
	_ backend.Templater          = (*Backend)(nil)
	_ backend.GuestProgramLister = (*Backend)(nil)
	_ backend.StartWarner        = (*Backend)(nil)
)

// Name implements backend.Backend.
func (b *Backend) Name() string { return Name }

// Driver is "qemu": QEMU runs the VMs.
func (b *Backend) Driver() string { return qemu.DriverName }

// GuestPrograms implements backend.GuestProgramLister: what the base
// image has besides every guest's programs (internal/image's recipe).
func (b *Backend) GuestPrograms() []string {
	return []string{"node", "npm", "npx", "python3", "curl"}
}

// StartWarning implements backend.StartWarner: a guest set up by an
// agent-vm from before network containment (state.Guest.Proxy false) is
// contained all the same, but nothing in it knows the proxy, which only
// its first boot sets up: it reaches no network until a reset.
func (b *Backend) StartWarning(r *state.Record) string {
	if r.Guest.Proxy {
		return ""
	}
	return fmt.Sprintf("the guest of %q was set up by an older agent-vm, before VMs' networks were contained: it is not configured for the egress proxy, so it reaches no network (hint: `agent-vm reset %s` sets it up again from the base image; the workspace, ports and network policy are kept, what was installed in the guest is not)", r.Branch, r.Slug)
}

// Settings is this backend's section of the VM record.
type Settings struct {
	// Image is the base image the VM boots (--image; empty: the default
	// built image), an absolute path.
	Image string `json:"image,omitempty"`
	// Provision counts re-provisioning requests (start --reprovision); the
	// guest's first-boot setup runs again whenever it changes.
	Provision int `json:"provision"`
	// Template: the VM is a template (see internal/template),
	// provisioned with the guest contract but nothing of one VM's.
	Template bool `json:"template,omitempty"`
	// Adopt, set on a fork until its first start, is the cloud-init
	// instance-id of the VM whose disk the fork's is a copy of (ForkDisk):
	// the guest boots as that VM, whose keys are kept in AdoptDir, and
	// the start gives it this VM's identity (backend.Plan.Adopt), then
	// clears this.
	Adopt string `json:"adopt,omitempty"`
	// Forked is Adopt as older agent-vms recorded it (no keys kept): the
	// next start provisions the disk again as start --reprovision does,
	// and clears it.
	Forked bool `json:"forked,omitempty"`
}

// Doctor implements backend.Backend: VMs boot from the base image, which
// `agent-vm image build` makes with mmdebstrap (as root).
func (b *Backend) Doctor(ctx context.Context) backend.Readiness {
	var r backend.Readiness
	if img, err := image.Lookup(b.ImageDir, image.DefaultBuildName); err == nil {
		r.Ready = true
		r.Checks = append(r.Checks, backend.Check{Name: "base image", OK: true,
			Detail: fmt.Sprintf("%s (%s, built %s)", img.Disk, img.Name, img.Manifest.Created.Format("2006-01-02"))})
	} else {
		r.Checks = append(r.Checks, backend.Check{Name: "base image", Detail: "none in " + b.ImageDir,
			Hint: "build it: `sudo agent-vm image build` (about 2 minutes), or `agent-vm image pull debian-12` and create VMs with --image"})
	}
	c := backend.Check{Name: "mmdebstrap (image build)"}
	if p, err := b.Run.LookPath("mmdebstrap"); err == nil {
		c.OK, c.Detail = true, p
		if os.Geteuid() != 0 {
			c.Detail += "; building images needs root"
		}
	} else {
		c.Detail, c.Hint = "not found", "to build images: `sudo agent-vm setup` installs it"
	}
	r.Checks = append(r.Checks, c)
	return r
}

// CheckCreate implements backend.Backend.
func (b *Backend) CheckCreate(f backend.CreateFlags) error {
	switch {
	case f.Config != "":
		return fmt.Errorf("--config adds a NixOS module, which the qemu backend (a Debian guest) does not use (hint: drop --config, or pass --backend nixos)")
	case f.Nixpkgs != "":
		return fmt.Errorf("--nixpkgs chooses the nixpkgs of the nixos backend; the qemu backend boots a Debian image (hint: drop --nixpkgs, or pass --backend nixos)")
	case f.Box != "":
		return fmt.Errorf("--box chooses the Vagrant box of the vagrant backend; the qemu backend boots a disk image (hint: drop --box, or pass --backend vagrant)")
	case f.Vagrantfile != "" && f.Vagrantfile != "auto":
		return fmt.Errorf("--vagrantfile chooses the Vagrantfile of the vagrant backend; the qemu backend runs no vagrant (hint: drop --vagrantfile, or pass --backend vagrant)")
	}
	if a, err := guest.LookupAgent(f.Agent); err == nil && !a.RunsOnDebian() {
		return fmt.Errorf("--agent %s: %s %s needs Node.js %d or newer, and the qemu backend's Debian 12 guest has Node.js %d, so it would not run (hint: another agent, or --backend nixos)", a.Name, a.Name, a.Version, a.Node, guest.DebianNode)
	}
	return cloudinit.CheckPackages(f.Packages)
}

// Reset implements backend.Backend: the overlay and its disk.json go, so the
// next start makes a new overlay on the base (the default image as it is
// now, or --image) and, under a new instance-id, cloud-init provisions it
// again, with the host key from the seed. A base that is gone is refused
// first, leaving the VM as it was.
func (b *Backend) Reset(ctx context.Context, l state.Layout, r *state.Record) error {
	s, err := state.SectionOf[Settings](r)
	if err != nil {
		return err
	}
	if s.Image != "" {
		if _, err := image.Inspect(ctx, b.Run, s.Image); err != nil {
			return fmt.Errorf("cannot reset VM %q: its base image --image %s: %w (hint: put the image back; the VM is unchanged)", r.Branch, s.Image, err)
		}
	} else if _, err := image.Lookup(b.ImageDir, image.DefaultBuildName); err != nil {
		return fmt.Errorf("cannot reset VM %q: there is no base image in %s to make a fresh disk from: %w (hint: build it with `sudo agent-vm image build`; the VM is unchanged)", r.Branch, b.ImageDir, err)
	}
	for _, f := range []string{DiskInfoFile, DiskFile} {
		if err := os.Remove(filepath.Join(l.Dir, f)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("removing the VM's disk: %w", err)
		}
	}
	s.Provision++ // a new instance-id: cloud-init provisions the new disk
	return r.SetSection(s)
}

// Provision implements backend.Backend: it records --image and checks the
// base image the first start will use (--image, else the default one, built
// then when missing) against --disk now, so a mistake is reported at create
// rather than at every start.
func (b *Backend) Provision(ctx context.Context, l state.Layout, r *state.Record, f backend.CreateFlags) error {
	s := Settings{Image: f.Image}
	if s.Image != "" {
		abs, err := filepath.Abs(s.Image)
		if err != nil {
			return fmt.Errorf("--image %s: %w", s.Image, err)
		}
		s.Image = abs
	}
	if err := r.SetSection(s); err != nil {
		return err
	}
	if s.Image == "" {
		size := int64(image.DefaultSizeBytes)
		if img, err := image.Lookup(b.ImageDir, image.DefaultBuildName); err == nil {
			size = img.Manifest.VirtualSizeBytes
		}
		return diskHolds(r.Resources.DiskGiB, "the default base image", size)
	}
	d, err := image.Inspect(ctx, b.Run, s.Image)
	if err != nil {
		return fmt.Errorf("--image: %w", err)
	}
	return diskHolds(r.Resources.DiskGiB, "the image "+s.Image, d.VirtualSize)
}

// diskHolds checks that a diskGiB overlay can be made on a base of size bytes.
func diskHolds(diskGiB int, base string, size int64) error {
	if int64(diskGiB)<<30 < size {
		return fmt.Errorf("--disk %dG is smaller than %s (%d GiB) (hint: leave --disk out, or give at least %dG)",
			diskGiB, base, size>>30, (size+(1<<30)-1)>>30)
	}
	return nil
}

// DiskInfo is disk.json: the base an overlay was made on, and how to boot
// it. The kernel travels with the base's immutable image version, so a
// rebuilt image never changes what an existing VM boots.
type DiskInfo struct {
	Base       string `json:"base"`
	BaseFormat string `json:"base_format"`
	Kernel     string `json:"kernel,omitempty"`
	Initrd     string `json:"initrd,omitempty"`
	Cmdline    string `json:"cmdline,omitempty"`
	// Template is the template disk the overlay was made on (itself an
	// overlay on Base), when the VM's first start was from a template.
	Template string `json:"template,omitempty"`
}

// CheckStart implements backend.Backend.
func (b *Backend) CheckStart(r *state.Record, f backend.StartFlags) error {
	if f.Nixpkgs != "" {
		return fmt.Errorf("--nixpkgs chooses the nixpkgs a nixos VM is built from; VM %q uses the qemu backend, which boots a Debian image (hint: drop --nixpkgs)", r.Branch)
	}
	return nil
}

// Prepare implements backend.Backend: the VM's overlay (made on first
// start), a fresh seed ISO, and a direct-kernel boot when the base has a
// kernel.
func (b *Backend) Prepare(ctx context.Context, l state.Layout, r *state.Record, o backend.PrepareOptions) (*backend.Plan, error) {
	forked, err := state.SectionOf[Settings](r)
	if err != nil {
		return nil, err
	}
	reprovision := o.Reprovision || forked.Forked
	s, err := seed.ForStart(r, reprovision, func(s *Settings) *int { return &s.Provision })
	if err != nil {
		return nil, err
	}
	adopt := s.Adopt
	if s.Forked || s.Adopt != "" {
		s.Forked, s.Adopt = false, ""
		if err := r.SetSection(s); err != nil {
			return nil, err
		}
	}
	if reprovision {
		adopt = "" // provisioned afresh
	}
	if adopt == "" {
		// The other VM's keys, when a start that was to use them ended
		// before it did: nothing will log in with them.
		os.RemoveAll(filepath.Join(l.Dir, AdoptDir))
	}
	disk, err := b.disk(ctx, l, r, s, o)
	if err != nil {
		return nil, err
	}
	c, err := seed.Config(l, r, s.Provision, o.CACerts)
	if err != nil {
		return nil, err
	}
	c.Template = s.Template
	if o.Template != "" {
		c.NPMPackages, c.NPMPrograms = seed.AgentPackages(r, o.TemplateAgents)
	}
	sc := c
	if adopt != "" {
		// The seed says the guest is the instance it was copied from, so
		// that its boot does not provision it again (the guest's setup
		// would reboot into cloud-init): the start makes it this VM.
		sc.InstanceID = adopt
	}
	if err := seed.Write(ctx, l, r, sc, b.Executable); err != nil {
		return nil, err
	}
	d := &qemu.Direct{
		Disks: []qemu.Disk{
			{Path: filepath.Join(l.Dir, DiskFile), Format: "qcow2"},
			{Path: filepath.Join(l.Dir, SeedFile), Format: "raw", ReadOnly: true},
		},
		Kernel: disk.Kernel, Initrd: disk.Initrd, Append: disk.Cmdline,
		MAC: cloudinit.DefaultMACAddress, // the network config matches the NIC by it
	}
	if reprovision && d.Kernel != "" {
		d.Append = strings.TrimSpace(d.Append + " " + cloudinit.ReprovisionKernelArg)
	}
	setup, err := cloudinit.Setup(cloudinit.SetupConfig{CACerts: o.CACerts, Placeholders: o.Placeholders, GitCredentials: o.GitCredentials})
	if err != nil {
		return nil, err
	}
	plan := &backend.Plan{Boot: qemu.Boot{Direct: d}, Settle: cloudinit.SettleCommand, SetupLog: guest.FirstBootLog, Setup: setup}
	if (disk.made && disk.Template != "") || adopt != "" {
		entropy := make([]byte, 64)
		if _, err := rand.Read(entropy); err != nil {
			return nil, err
		}
		p, err := cloudinit.Personalize(c, entropy)
		if err != nil {
			return nil, err
		}
		if adopt != "" {
			plan.Adopt = &backend.Adopt{Keys: filepath.Join(l.Dir, AdoptDir), Personalize: p}
		} else {
			_, err := os.Stat(filepath.Join(l.Workspace(), guest.ProvisionScript))
			quick := !cloudinit.FirstRunInstalls(c) && errors.Is(err, os.ErrNotExist)
			plan.Clone = &backend.Clone{Personalize: p, FirstRun: cloudinit.FirstRun(c), Quick: quick}
		}
	}
	return plan, nil
}

// madeDisk is the VM's disk, and whether this start made it.
type madeDisk struct {
	DiskInfo
	made bool
}

// disk returns the VM's disk, making the overlay on first start: on
// o.Template when given (which must be an overlay on the same base).
func (b *Backend) disk(ctx context.Context, l state.Layout, r *state.Record, s Settings, o backend.PrepareOptions) (*madeDisk, error) {
	infoPath := filepath.Join(l.Dir, DiskInfoFile)
	overlay := filepath.Join(l.Dir, DiskFile)
	if raw, err := os.ReadFile(infoPath); err == nil {
		var info DiskInfo
		if err := json.Unmarshal(raw, &info); err != nil {
			return nil, fmt.Errorf("%s: %w", infoPath, err)
		}
		if _, err := os.Stat(overlay); err != nil {
			return nil, fmt.Errorf("the VM's disk %s is missing: %w (hint: `agent-vm destroy %s` and create the VM again)", overlay, err, r.Slug)
		}
		for _, f := range []string{info.Base, info.Template} {
			if _, err := os.Stat(f); f != "" && err != nil {
				return nil, fmt.Errorf("the disk %s this VM's disk is made on is gone (was it pruned or moved?) (hint: put it back, or destroy and recreate the VM)", f)
			}
		}
		// Again at every start: a disk made before its template kept
		// records of its users gets one.
		if err := markUsed(info, overlay); err != nil && b.Log != nil {
			b.Log.Warn("could not record the VM's disk as a user of the disks it is made on; another state directory's template build or image prune could remove them", "error", err)
		}
		return &madeDisk{DiskInfo: info}, nil
	}
	info, err := b.base(ctx, s, o)
	if err != nil {
		return nil, err
	}
	o.Report.Report("creating the VM's disk", 0, "")
	on, format := info.Base, info.BaseFormat
	if o.Template != "" {
		t := filepath.Join(o.Template, DiskFile)
		if err := fitsTemplate(ctx, b.Run, t, info.Base, int64(r.Resources.DiskGiB)<<30); err != nil {
			return nil, err
		}
		info.Template, on, format = t, t, "qcow2"
	}
	if err := image.CreateOverlay(ctx, b.Run, on, format, overlay, int64(r.Resources.DiskGiB)<<30); err != nil {
		return nil, err
	}
	if err := markUsed(*info, overlay); err != nil {
		os.Remove(overlay)
		return nil, err
	}
	raw, _ := json.MarshalIndent(info, "", "  ")
	if err := atomicfile.Write(infoPath, append(raw, '\n'), 0o600); err != nil {
		os.Remove(overlay)
		return nil, err
	}
	return &madeDisk{DiskInfo: *info, made: true}, nil
}

// markUsed records overlay as a user of the disks it is made on (info's
// base image and template), where every state directory's template
// removal and image prune look: a VM of another state directory sharing
// the cache (integration-test's, bench's, another --state-dir) must not
// have them removed under it.
func markUsed(info DiskInfo, overlay string) error {
	if err := image.MarkUsed(info.Base, overlay); err != nil {
		return err
	}
	if info.Template != "" {
		return image.MarkUser(info.Template, overlay)
	}
	return nil
}

// fitsTemplate checks that a template's disk is an overlay on the base
// this VM would boot, of the VM's size (the restored guest knows its
// disk's size).
func fitsTemplate(ctx context.Context, run execx.Runner, disk, base string, size int64) error {
	d, err := image.Inspect(ctx, run, disk)
	switch {
	case err != nil:
		return fmt.Errorf("%w: its disk: %v", backend.ErrTemplateMismatch, err)
	case d.BackingFile != base:
		return fmt.Errorf("%w: it was made on the base image %s, and this VM boots %s (hint: `agent-vm template build` again replaces it with one on this base)", backend.ErrTemplateMismatch, d.BackingFile, base)
	case d.VirtualSize != size:
		return fmt.Errorf("%w: its disk has %d bytes, this VM's %d", backend.ErrTemplateMismatch, d.VirtualSize, size)
	}
	return nil
}

// base picks the base image: --image, else the default built image, built
// now if the host can. An --image that is the disk of one of agent-vm's
// images (a version directory of the image cache, say an older build kept
// on purpose) boots as that image does, with the kernel beside it: its disk
// has no boot loader.
func (b *Backend) base(ctx context.Context, s Settings, o backend.PrepareOptions) (*DiskInfo, error) {
	if s.Image != "" {
		own, err := ownImage(s.Image)
		if err != nil {
			return nil, err
		}
		if own != nil {
			return diskInfoOf(own), nil
		}
		d, err := image.Inspect(ctx, b.Run, s.Image)
		if err != nil {
			return nil, err
		}
		return &DiskInfo{Base: d.Path, BaseFormat: d.Format}, nil
	}
	img, err := image.Lookup(b.ImageDir, image.DefaultBuildName)
	if errors.Is(err, image.ErrNotFound) && b.BuildImage != nil {
		o.Report.Report("building the base image (first start on this host, about 2 minutes)", 0, "")
		img, err = b.BuildImage(ctx)
	}
	if errors.Is(err, image.ErrNotFound) {
		return nil, fmt.Errorf("there is no base image in %s (hint: build it with `sudo agent-vm image build` (about 2 minutes), or create the VM with --image PATH, e.g. from `agent-vm image pull debian-12`)", b.ImageDir)
	}
	if err != nil {
		return nil, err
	}
	return diskInfoOf(img), nil
}

func diskInfoOf(img *image.Image) *DiskInfo {
	return &DiskInfo{Base: img.Disk, BaseFormat: img.Format, Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline}
}

// ownImage is the agent-vm image whose disk path is (through symlinks,
// which are resolved: the image's current-version link moves, and pruning
// goes by the version's own path), or nil when path is not one. A version
// directory whose manifest or files are damaged is an error: its disk
// would boot without the kernel it needs.
func ownImage(path string) (*image.Image, error) {
	disk, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, nil // image.Inspect says what is wrong with it
	}
	dir := filepath.Dir(disk)
	if _, err := os.Stat(filepath.Join(dir, image.ManifestFile)); err != nil {
		return nil, nil
	}
	img, err := image.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("--image %s: %w", path, err)
	}
	if img.Disk != disk {
		return nil, nil
	}
	return img, nil
}

// Release implements backend.Backend: a Debian VM has nothing outside its
// directory to let go of first.
func (b *Backend) Release(state.Layout) error { return nil }

// ImagesInUse implements backend.Backend: the base image the VM's disk was
// made on and the template's disk between them, if any (none before its
// first start).
func (b *Backend) ImagesInUse(l state.Layout) []string {
	raw, err := os.ReadFile(filepath.Join(l.Dir, DiskInfoFile))
	if err != nil {
		return nil
	}
	var info DiskInfo
	if json.Unmarshal(raw, &info) != nil || info.Base == "" {
		return nil
	}
	if info.Template != "" {
		return []string{info.Base, info.Template}
	}
	return []string{info.Base}
}
