package vm

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/hosts"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/libvirt"
	"github.com/agent-vm/agent-vm/internal/libvirtbackend"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/pins"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/secret"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vagrant"
	"github.com/agent-vm/agent-vm/internal/vagrantbackend"
)

// Config is what the composition root (Open) needs from the program that
// runs it: where things live and how to reach the outside world. Open
// builds everything else (backends, the QEMU driver, the accelerator
// probe, the image cache's path), so the CLI knows no backend or driver.
type Config struct {
	StateDir string // required
	// WorkDir is where the command runs; its repository scopes names
	// (see Find). "" means outside any repository.
	WorkDir string
	Getenv  func(string) string // nil = os.Getenv
	Log     hclog.Logger        // nil = no logs
	Run     execx.Runner        // nil = execx.OS{}
	// Progress receives the output of long steps: package installs, the
	// image build, nix build. nil = io.Discard.
	Progress io.Writer
	// Executable is the agent-vm binary guests run as agent-mcp; nil =
	// os.Executable.
	Executable func() (string, error)
	// Roots are where agent-vm's host directories outside the state
	// directory go (see hostdir.Table); the zero value is the real places.
	Roots hostdir.Roots
}

// Open opens the state directory and wires the orchestration: the one
// place that knows which backends and drivers exist.
func Open(c Config) (*Manager, error) {
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	if c.Log == nil {
		c.Log = hclog.NewNullLogger()
	}
	if c.Run == nil {
		c.Run = execx.OS{}
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Executable == nil {
		c.Executable = os.Executable
	}
	root, err := state.Open(hostdir.StateDir(c.StateDir))
	if err != nil {
		return nil, err
	}
	launcher, err := qemu.NewLauncher(c.Run, c.Log.Named("qemu"))
	if err != nil {
		return nil, err
	}
	launcher.NoSandbox = c.Getenv("AGENT_VM_QEMU_SANDBOX") == "off"
	dirs := hostdir.NewTable(c.Roots, c.Getenv, os.Geteuid())
	launcher.Egress = dirs.Egress
	vd := &vagrant.Driver{Run: c.Run, Log: c.Log.Named("vagrant"), Progress: c.Progress, Home: dirs.VagrantHome.Path, Handoff: dirs.Handoff}
	ld := &libvirt.Driver{Run: c.Run, Log: c.Log.Named("libvirt"), Handoff: dirs.Handoff, Executable: c.Executable}
	if dirs.Pool != nil {
		ld.Pool = dirs.Pool.Path
	}
	m := New(root, c.Run, c.Log, []driver.Driver{qemu.NewDriver(launcher), vd, ld})
	m.Registry = &state.Registry{Dir: dirs.Registry}
	if err := m.Registry.Add(root.Dir); err != nil {
		// Only port allocation across state directories is lost.
		c.Log.Warn("this state directory's VMs' ports may be given out again by agent-vm runs in other state directories", "error", err)
	}
	m.WorkDir = c.WorkDir
	m.dirs = dirs
	m.TemplateDir = dirs.Templates
	m.Secrets = &secret.Store{Dir: dirs.Secrets}
	m.Hosts = &hosts.Registry{Dir: dirs.Hosts}
	m.PinFile = &pins.File{Dir: dirs.Config}
	m.progress, m.getenv, m.Executable = c.Progress, c.Getenv, c.Executable
	m.Accel = func(ctx context.Context) accel.Result { return m.probeAccel(ctx, launcher.Arch.Binary) }
	for _, b := range m.backends(c) {
		m.Backends[b.Name()] = b
	}
	return m, nil
}

// backends are the VM flavours this build has.
func (m *Manager) backends(c Config) []backend.Backend {
	q := &debian.Backend{Run: c.Run, Log: c.Log.Named("qemu"), ImageDir: m.ImageDir(), Executable: c.Executable}
	if os.Geteuid() == 0 {
		// "It works first time": the first start on a host builds the base
		// image (mmdebstrap's root mode needs root).
		q.BuildImage = func(ctx context.Context) (*image.Image, error) {
			if err := m.setupFirst(ctx, hostpkgs.Image); err != nil {
				return nil, err
			}
			return m.buildImage(ctx, ImageBuildOptions{})
		}
	}
	return []backend.Backend{
		q,
		&nixos.Backend{Run: c.Run, Log: c.Log.Named("nixos"), Getenv: c.Getenv, Executable: c.Executable, Progress: c.Progress},
		&vagrantbackend.Backend{Run: c.Run, Log: c.Log.Named("vagrant"), Executable: c.Executable, ImageDir: m.ImageDir(), Home: m.dirs.VagrantHome, Progress: c.Progress},
		&libvirtbackend.Backend{Run: c.Run, Log: c.Log.Named("libvirt"), Executable: c.Executable, ImageDir: m.ImageDir(), BuildImage: q.BuildImage},
	}
}

// DefaultStateDir is $XDG_DATA_HOME/agent-vms, i.e. ~/.local/share/agent-vms.
func DefaultStateDir(getenv func(string) string) string {
	return hostdir.XDG(getenv, "XDG_DATA_HOME", filepath.Join(".local", "share"), "agent-vms")
}

// ImageDir is where base images are cached ("" in a Manager New made).
func (m *Manager) ImageDir() string {
	if m.dirs.Images == nil {
		return ""
	}
	return m.dirs.Images.Path
}

// probeAccel decides between KVM and TCG once per host boot (cached), by
// running the QEMU binary qemuBin: the accelerator is a QEMU matter, which
// is why the composition root wires it.
func (m *Manager) probeAccel(ctx context.Context, qemuBin string) accel.Result {
	return m.prober(qemuBin).Probe(ctx)
}

func (m *Manager) prober(qemuBin string) *accel.Prober {
	qemuPath, err := m.Run.LookPath(qemuBin)
	if err != nil {
		qemuPath = qemuBin
	}
	kernels, _ := filepath.Glob(filepath.Join(m.ImageDir(), "*", "vmlinuz*"))
	kernels = append(kernels, "/run/current-system/kernel")
	return &accel.Prober{Run: m.Run, QEMU: qemuPath, Kernels: kernels, CacheDir: m.dirs.Cache, Override: m.getenv("AGENT_VM_ACCEL")}
}

// HostCommand is the hidden verb of agent-vm's binary that serves, on a
// host VMs are placed on, one request of the libvirt driver running them
// from another machine.
const HostCommand = libvirt.HostCommand

// ServeHost serves that request: read from in, answered on out.
func ServeHost(ctx context.Context, in io.Reader, out io.Writer, log hclog.Logger) error {
	return libvirt.ServeHost(ctx, in, out, log)
}
