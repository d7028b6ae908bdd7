// Package wire is agent-vm's composition root: the one place that knows
// which backends and drivers this build has. Open builds them (the QEMU
// launcher and driver, vagrant's and libvirt's drivers, the Debian, NixOS,
// vagrant and libvirt backends) and hands them to a vm.Manager, which
// knows them only through the contracts (internal/backend, internal/driver).
// cli opens its Manager here; neither cli nor vm imports a backend or a
// driver.
package wire

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
	"github.com/agent-vm/agent-vm/internal/fork"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hosts"
	"github.com/agent-vm/agent-vm/internal/libvirt"
	"github.com/agent-vm/agent-vm/internal/libvirtbackend"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/pins"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/secret"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/template"
	"github.com/agent-vm/agent-vm/internal/vagrant"
	"github.com/agent-vm/agent-vm/internal/vagrantbackend"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// Config is what Open needs from the program that runs it: where things
// live and how to reach the outside world.
type Config struct {
	StateDir string // required
	// WorkDir is where the command runs; its repository scopes names
	// (see vm.Manager.Find). "" means outside any repository.
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

// Open opens the state directory and returns the Manager over it, with
// every backend and driver of this build.
func Open(c Config) (*vm.Manager, error) {
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
	m := vm.New(root, c.Run, c.Log, []driver.Driver{qemu.NewDriver(launcher), vd, ld})
	m.Registry = &state.Registry{Dir: dirs.Registry}
	if err := m.Registry.Add(root.Dir); err != nil {
		// Only port allocation across state directories is lost.
		c.Log.Warn("this state directory's VMs' ports may be given out again by agent-vm runs in other state directories", "error", err)
	}
	m.WorkDir = c.WorkDir
	m.Dirs = dirs
	m.TemplateDir = dirs.Templates
	m.Secrets = &secret.Store{Dir: dirs.Secrets}
	m.Hosts = &hosts.Registry{Dir: dirs.Hosts}
	m.Host.Cache, m.Host.Pins, m.Host.Progress = dirs.Images, &pins.File{Dir: dirs.Config}, c.Progress
	m.Progress, m.Getenv, m.Executable = c.Progress, c.Getenv, c.Executable
	// The accelerator is a QEMU matter: the probe runs the launcher's binary.
	m.Accel = func(ctx context.Context) accel.Result { return Prober(m, launcher.Arch.Binary).Probe(ctx) }
	for _, b := range backends(c, m) {
		m.Backends[b.Name()] = b
	}
	// Doctor's line about the templates is the template room's.
	m.Host.Extra = func(ctx context.Context) []backend.Check { return []backend.Check{Templates(m).Check(ctx)} }
	return m, nil
}

// Templates are the templates' commands over m's VMs and templates'
// directory (cli's `template` and `setup --template`, doctor's line).
func Templates(m *vm.Manager) template.Templates {
	return template.Templates{VMs: m, Dir: m.TemplateDir, Log: m.Log, Now: m.Now}
}

// Forks makes forks of m's VMs (cli's `fork`).
func Forks(m *vm.Manager) fork.Forks {
	return fork.Forks{VMs: m, Root: m.Root, Git: m.Git, Log: m.Log.Named("fork"), Now: m.Now}
}

// backends are the VM flavours this build has.
func backends(c Config, m *vm.Manager) []backend.Backend {
	q := &debian.Backend{Run: c.Run, Log: c.Log.Named("qemu"), ImageDir: m.ImageDir(), Executable: c.Executable}
	if os.Geteuid() == 0 {
		// "It works first time": the first start on a host builds the base
		// image (mmdebstrap's root mode needs root).
		q.BuildImage = m.Host.FirstImage
	}
	return []backend.Backend{
		q,
		&nixos.Backend{Run: c.Run, Log: c.Log.Named("nixos"), Getenv: c.Getenv, Executable: c.Executable, Progress: c.Progress},
		&vagrantbackend.Backend{Run: c.Run, Log: c.Log.Named("vagrant"), Executable: c.Executable, ImageDir: m.ImageDir(), Home: m.Dirs.VagrantHome, Progress: c.Progress},
		&libvirtbackend.Backend{Run: c.Run, Log: c.Log.Named("libvirt"), Executable: c.Executable, ImageDir: m.ImageDir(), BuildImage: q.BuildImage},
	}
}

// HostCommand is the hidden verb of agent-vm's binary that serves, on a
// host VMs are placed on, one request of the libvirt driver running them
// from another machine.
const HostCommand = libvirt.HostCommand

// ServeHost serves that request: read from in, answered on out.
func ServeHost(ctx context.Context, in io.Reader, out io.Writer, log hclog.Logger) error {
	return libvirt.ServeHost(ctx, in, out, log)
}

// Prober is the accelerator probe of the QEMU binary qemuBin (a cached
// real probe, once per host boot), with its cache in agent-vm's host
// cache: the accelerator is a QEMU matter, so the probe runs the
// launcher's binary.
func Prober(m *vm.Manager, qemuBin string) *accel.Prober {
	qemuPath, err := m.Run.LookPath(qemuBin)
	if err != nil {
		qemuPath = qemuBin
	}
	kernels, _ := filepath.Glob(filepath.Join(m.ImageDir(), "*", "vmlinuz*"))
	kernels = append(kernels, "/run/current-system/kernel")
	return &accel.Prober{Run: m.Run, QEMU: qemuPath, Kernels: kernels, CacheDir: m.Dirs.Cache, Override: m.Getenv("AGENT_VM_ACCEL")}
}

// DefaultStateDir is the state directory without --state-dir:
// $XDG_DATA_HOME/agent-vms, i.e. ~/.local/share/agent-vms.
func DefaultStateDir(getenv func(string) string) string {
	return hostdir.XDG(getenv, "XDG_DATA_HOME", filepath.Join(".local", "share"), "agent-vms")
}
