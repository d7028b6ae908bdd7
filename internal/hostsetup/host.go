package hostsetup

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/pins"
)

// Host is this machine as agent-vm sets it up and keeps it: the packages
// VMs (and the tests) need, agent-vm's own account, the base images and
// doctor's report. vm's Manager holds one (made by vm.New, its image
// cache, pins and progress set by wire.Open), asks it what a start needs
// first, and the CLI reaches it through the Manager.
type Host struct {
	Run      execx.Runner
	Log      hclog.Logger
	Progress io.Writer    // package installs' and the image build's output
	Cache    *hostdir.Dir // the base image cache; nil: none
	Pins     *pins.File   // the host's pins of the package sources; nil: none
	// Backends and Drivers are this build's: doctor asks each, setup
	// installs what a backend needs. Default names the backend create
	// picks ("" when none).
	Backends map[string]backend.Backend
	Drivers  map[string]driver.Driver
	Default  func() string
	Accel    func(ctx context.Context) accel.Result
	// InUse are the images VMs' and templates' disks are made on (image
	// prune keeps them); an error when a VM's cannot be told.
	InUse func(ctx context.Context) (map[string]bool, error)
	// Extra are doctor's checks of the Manager's own (the templates').
	Extra func(ctx context.Context) []Check
}

func (h *Host) pkgs() hostpkgs.Host { return hostpkgs.Host{Run: h.Run} }

// ImageDir is the base image cache's path ("" without one).
func (h *Host) ImageDir() string {
	if h.Cache == nil {
		return ""
	}
	return h.Cache.Path
}

// Setup is `agent-vm setup`: the packages running VMs (and, with tests,
// the test suite; with a backend that needs more, such as vagrant, that
// backend) need and the base image, asking consent once.
func (h *Host) Setup(ctx context.Context, tests bool, backendName string, consent func(actions []string) (bool, error)) (Report, error) {
	need, err := h.need(tests, backendName)
	if err != nil {
		return Report{}, err
	}
	return Setup(ctx, h.pkgs(), Options{Need: need, ImageDir: h.ImageDir(),
		Build: func(ctx context.Context) (*image.Image, error) { return h.buildImage(ctx, ImageBuildOptions{}) },
		Root:  os.Geteuid() == 0, Consent: consent, Out: h.Progress})
}

// Prepare is what a start does before it boots (First, for running VMs).
func (h *Host) Prepare(ctx context.Context) error { return h.first(ctx, hostpkgs.Run) }

func (h *Host) first(ctx context.Context, need hostpkgs.Need) error {
	return First(ctx, h.pkgs(), need, os.Geteuid() == 0, h.Progress)
}

// Account is the ids of agent-vm's own account (hostpkgs.Account), which
// a root-owned workspace is handed to and its VM's QEMU, virtiofsd and
// proxy run as; made now, with a notice, on a host setup has not made it
// on, as a start installs what is missing.
func (h *Host) Account(ctx context.Context) (uid, gid int, err error) {
	p := h.pkgs()
	uid, gid, ok, err := p.AccountIDs()
	if err != nil || ok {
		return uid, gid, err
	}
	if uid, gid, err = p.CreateAccount(ctx); err != nil {
		return 0, 0, err
	}
	fmt.Fprintf(h.Progress, "agent-vm: made the system account %s (uid %d) that VMs run as, as `agent-vm setup` does\n", hostpkgs.Account, uid)
	return uid, gid, nil
}

// need is what setup installs: what running VMs need, the backend's own
// needs (a backend.HostNeeder's; "" and auto add none), and the tests'.
func (h *Host) need(tests bool, name string) (hostpkgs.Need, error) {
	need := hostpkgs.Run | hostpkgs.Image
	if name != "" && name != "auto" {
		be, ok := h.Backends[name]
		if !ok {
			return 0, fmt.Errorf("--backend %q: must be auto, qemu, nixos, vagrant or libvirt", name)
		}
		if n, ok := be.(backend.HostNeeder); ok {
			need |= n.HostNeeds()
		}
	}
	if tests {
		need |= hostpkgs.Test
	}
	return need, nil
}

// CheckPrograms is `setup --check`: every program agent-vm (with tests,
// the test suite; with a backend that needs more, that backend) runs.
func (h *Host) CheckPrograms(tests bool, backendName string) ([]ProgramCheck, error) {
	need, err := h.need(tests, backendName)
	if err != nil {
		return nil, err
	}
	flag := ""
	if _, ok := h.Backends[backendName].(backend.HostNeeder); ok {
		flag = backendName
	}
	return CheckPrograms(h.pkgs(), need, tests, flag)
}

// Doctor checks the host (Doctor) with this build's drivers and backends,
// the default backend first, and the Manager's own checks.
func (h *Host) Doctor(ctx context.Context) DoctorReport {
	in := DoctorInput{Run: h.Run, Accel: h.Accel(ctx), ImageDir: h.ImageDir(), Pins: h.Pins}
	if h.Extra != nil {
		in.Extra = h.Extra(ctx)
	}
	for _, name := range slices.Sorted(maps.Keys(h.Drivers)) {
		in.Drivers = append(in.Drivers, h.Drivers[name])
	}
	if h.Default != nil {
		in.Default = h.Default()
	}
	names := slices.DeleteFunc(slices.Sorted(maps.Keys(h.Backends)), func(n string) bool { return n == in.Default })
	if _, ok := h.Backends[in.Default]; ok {
		names = append([]string{in.Default}, names...)
	}
	for _, name := range names {
		in.Backends = append(in.Backends, h.Backends[name])
	}
	return Doctor(ctx, in)
}

// Image defaults, for the CLI's flags and messages.
const (
	DefaultImageRelease = image.DefaultRelease
	DefaultImageMirror  = image.DefaultMirror
)

// PullableImages are the names `image pull` knows.
func PullableImages() []string { return image.PullNames() }

// ImageBuildOptions are `image build`'s flags.
type ImageBuildOptions struct {
	Release string // "" = DefaultImageRelease
	Mirror  string // "" = DefaultImageMirror
	Force   bool   // build a new version even if a current one is cached
}

// BuildImage builds the Debian base image into the image cache.
func (h *Host) BuildImage(ctx context.Context, o ImageBuildOptions) (image.Info, error) {
	img, err := h.buildImage(ctx, o)
	if err != nil {
		return image.Info{}, err
	}
	return img.Info(), nil
}

func (h *Host) buildImage(ctx context.Context, o ImageBuildOptions) (*image.Image, error) {
	return image.Build(ctx, image.BuildOptions{Release: o.Release, Mirror: o.Mirror, Force: o.Force,
		Cache: h.Cache, Runner: h.Run, Progress: h.Progress, Logger: h.Log.Named("image")})
}

// FirstImage builds the base image on a host that has none, as the first
// start there does: the packages the build needs first (First).
func (h *Host) FirstImage(ctx context.Context) (*image.Image, error) {
	if err := h.first(ctx, hostpkgs.Image); err != nil {
		return nil, err
	}
	return h.buildImage(ctx, ImageBuildOptions{})
}

// ImagePullOptions are `image pull`'s arguments.
type ImagePullOptions struct {
	Name    string // see PullableImages
	BaseURL string // "" = the distribution's site
	Force   bool
}

// PullImage downloads an official cloud image and checks its checksum.
func (h *Host) PullImage(ctx context.Context, o ImagePullOptions) (image.Info, error) {
	img, err := image.Pull(ctx, image.PullOptions{Name: o.Name, BaseURL: o.BaseURL, Force: o.Force,
		Cache: h.Cache, Runner: h.Run, Progress: h.Progress, Logger: h.Log.Named("image")})
	if err != nil {
		return image.Info{}, err
	}
	return img.Info(), nil
}

// Images lists the cached images.
func (h *Host) Images() ([]image.Info, error) { return image.Infos(h.ImageDir()) }

// PruneImages removes cached image versions that were replaced and that no
// VM's or template's disk is made on, and returns what it removed.
func (h *Host) PruneImages(ctx context.Context) ([]string, error) {
	used, err := h.InUse(ctx)
	if err != nil {
		return nil, err
	}
	return image.Prune(ctx, h.Cache, func(disk string) bool { return used[disk] })
}

// Pin is setup's pins step (Pin; record: not --no-pins).
func (h *Host) Pin(ctx context.Context, record bool) (PinReport, error) {
	return Pin(ctx, PinOptions{File: h.Pins, ImageDir: h.ImageDir(), Record: record})
}
