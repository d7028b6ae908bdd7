// Package vm orchestrates a VM's life (find, create, start, stop, restart,
// destroy, sync, reset, status, exec, shell, ssh-config, logs, suspend, resume)
// over the state directory and the VM's record, the git workspace, the
// backend contract (internal/backend) each kind of guest implements and the
// driver contract (internal/driver) their backends name. The composition
// root, internal/wire, builds the backends and drivers and hands them to a
// Manager: vm imports none of them, and the CLI reaches backends, drivers,
// images and host set-up only through a Manager.
//
// What has a vocabulary of its own lives in a room of its own, which vm
// calls with plain data, a connection or a small interface (boot,
// template, hostsetup, guestconn, guestctl, netpolicy, portbook,
// sshconfig, logtail, placement); the rooms that act on VMs themselves
// (agent, mcpsync, netpolicy, forward, browser, and template's commands)
// declare the few Manager methods they need (access.go) and cli passes
// the Manager in. None of them imports vm. docs/ARCHITECTURE.md draws the
// layers and lists every package.
package vm

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/hostca"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hosts"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/secret"
	"github.com/agent-vm/agent-vm/internal/size"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Backend names as the user types them.
const (
	BackendAuto  = "auto"
	BackendQEMU  = "qemu"
	BackendNixOS = "nixos"
	// BackendVagrant: the Debian guest run by vagrant (vagrant-libvirt).
	BackendVagrant = "vagrant"
	// BackendLibvirt: the Debian guest run through this machine's libvirt.
	BackendLibvirt = "libvirt"
)

// Manager carries what every verb needs. Construct it with New.
type Manager struct {
	Root     *state.Root
	Git      *gitws.Git
	Run      execx.Runner
	Log      hclog.Logger
	Backends map[string]backend.Backend
	// PortFree probes a host port; ports.Listenable outside tests.
	PortFree ports.Probe
	// Registry lists this user's other state directories, whose VMs'
	// ports are taken too (see state.Registry); nil: only Root's.
	Registry *state.Registry
	Now      func() time.Time
	// Size reports the host's RAM and CPU threads (create checks sizes
	// against it).
	Size func() size.Host
	// IsNixOS reports whether this host runs NixOS (backend "auto").
	IsNixOS func() bool
	// Drivers run the VMs, by name; each backend names its own (see
	// driverOf).
	Drivers map[string]driver.Driver
	// Accel decides between KVM and TCG (a cached real probe).
	Accel func(ctx context.Context) accel.Result
	// Executable is this agent-vm binary, which runs each VM's egress
	// proxy and its relays (nil: os.Executable).
	Executable func() (string, error)
	// WorkDir is the directory the command runs in: its repository scopes
	// the names Find resolves. "" means outside any repository.
	WorkDir string
	// HostCAs returns the PEM CA certificates the host added to its trust
	// store, which guests trust too (hostca.Finder outside tests).
	HostCAs func() ([]string, error)
	// TemplateDir holds the templates new VMs start from
	// (internal/template), a state directory; nil turns templates off.
	TemplateDir *hostdir.Dir
	// Secrets is the host's store of credentials (internal/secret), whose
	// secrets in a VM's scope its start hands the VM's egress proxy; nil
	// for none.
	Secrets *secret.Store
	// Hosts is the registry of libvirt hosts (internal/hosts) that
	// `host` edits and checks and `create --host` places VMs on; nil for
	// none.
	Hosts *hosts.Registry
	// Host is this machine as agent-vm sets it up (hostsetup.Host): its
	// packages, agent-vm's account, the base images, the pins every VM's
	// policy carries, doctor. New makes it over the Manager's backends and
	// drivers; wire.Open gives it the image cache, the pins and progress.
	Host *hostsetup.Host
	// templates: this Manager drives templates (forTemplates), whose
	// guests get no proxy CA and no secret (their clones get their own).
	templates bool
	// Dirs are agent-vm's host directories outside the state directory
	// (hostdir.Table); the zero value has none (no image cache, no
	// templates, no egress sockets' home).
	Dirs hostdir.Table
	// Progress receives the output of long steps: package installs, the
	// image build, nix build.
	Progress io.Writer
	// Getenv reads the environment (os.Getenv outside tests).
	Getenv func(string) string
}

// New returns a Manager with the real probes.
func New(root *state.Root, run execx.Runner, log hclog.Logger, drivers []driver.Driver, backends ...backend.Backend) *Manager {
	m := &Manager{Root: root, Git: gitws.New(run), Run: run, Log: log, Backends: map[string]backend.Backend{},
		Drivers: map[string]driver.Driver{}, PortFree: ports.Listenable, Now: time.Now, Size: size.ReadHost, IsNixOS: isNixOS,
		Progress: io.Discard, Getenv: os.Getenv}
	m.HostCAs = m.hostCAs
	m.Host = &hostsetup.Host{Run: run, Log: log, Progress: io.Discard, Backends: m.Backends, Drivers: m.Drivers,
		Default: m.defaultBackend, Accel: func(ctx context.Context) accel.Result { return m.Accel(ctx) },
		InUse: m.imagesInUse}
	for _, d := range drivers {
		m.Drivers[d.Name()] = d
	}
	for _, b := range backends {
		m.Backends[b.Name()] = b
	}
	return m
}

// defaultDriver runs the VMs whose backend this build lacks or whose record
// cannot be read: every backend so far runs on QEMU.
const defaultDriver = "qemu"

// driverOf returns the driver that runs the VM whose record is r (nil when
// unreadable): the one its backend names.
func (m *Manager) driverOf(r *state.Record) (driver.Driver, error) {
	name := defaultDriver
	if r != nil {
		if be, ok := m.Backends[r.Backend]; ok {
			name = be.Driver()
		}
	}
	d, ok := m.Drivers[name]
	if !ok {
		return nil, fmt.Errorf("internal error: this agent-vm has no %q driver", name)
	}
	return d, nil
}

// Backend returns the backend of the VM whose record is r, or an error
// saying that this build cannot verb it.
func (m *Manager) Backend(r *state.Record, verb string) (backend.Backend, error) {
	be, ok := m.Backends[r.Backend]
	if !ok {
		return nil, fmt.Errorf("VM %q uses the %s backend, which this agent-vm cannot %s (hint: use an agent-vm build with that backend, or recreate the VM with --backend qemu)", r.Branch, r.Backend, verb)
	}
	return be, nil
}

func isNixOS() bool {
	_, err := os.Stat("/etc/NIXOS")
	return err == nil
}

// defaultBackend is the backend create picks without --backend ("" when
// this build lacks it).
func (m *Manager) defaultBackend() string {
	if b, err := m.resolveBackend(BackendAuto); err == nil {
		return b.Name()
	}
	return ""
}

// resolveBackend turns --backend into a backend this build has.
func (m *Manager) resolveBackend(name string) (backend.Backend, error) {
	switch name {
	case "", BackendAuto:
		name = BackendQEMU
		if m.IsNixOS() {
			name = BackendNixOS
		}
	}
	b, ok := m.Backends[name]
	if !ok {
		return nil, fmt.Errorf("unknown backend %q (hint: use --backend auto, qemu, nixos, vagrant or libvirt)", name)
	}
	return b, nil
}

// hostCAs finds the host's added CA certificates (hostca.Load).
func (m *Manager) hostCAs() ([]string, error) { return hostca.Load(m.Getenv, m.Log) }

// executable is the agent-vm binary (Manager.Executable, else this one).
func (m *Manager) executable() (string, error) {
	if m.Executable != nil {
		return m.Executable()
	}
	return os.Executable()
}
