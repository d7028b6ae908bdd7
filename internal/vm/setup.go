package vm

import (
	"context"
	"fmt"
	"os"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/image"
)

// Host set-up is internal/hostsetup's; the Manager hands it this host, the
// image cache and what its backends need.

// SetupHost is `agent-vm setup`: the packages running VMs (and, with
// tests, the test suite; with a backend that needs more, such as vagrant,
// that backend) need and the base image, asking consent once.
func (m *Manager) SetupHost(ctx context.Context, tests bool, backendName string, consent func(actions []string) (bool, error)) (hostsetup.Report, error) {
	need, err := m.setupNeed(tests, backendName)
	if err != nil {
		return hostsetup.Report{}, err
	}
	return hostsetup.Setup(ctx, hostpkgs.Host{Run: m.Run}, hostsetup.Options{Need: need, ImageDir: m.ImageDir(),
		Build: func(ctx context.Context) (*image.Image, error) { return m.buildImage(ctx, ImageBuildOptions{}) },
		Root:  os.Geteuid() == 0, Consent: consent, Out: m.Progress})
}

// PrepareHost is what start does before it boots (hostsetup.First).
func (m *Manager) PrepareHost(ctx context.Context) error { return m.setupFirst(ctx, hostpkgs.Run) }

func (m *Manager) setupFirst(ctx context.Context, need hostpkgs.Need) error {
	return hostsetup.First(ctx, hostpkgs.Host{Run: m.Run}, need, os.Geteuid() == 0, m.Progress)
}

// account is the ids of agent-vm's own account (hostpkgs.Account), which
// a root-owned workspace is handed to and its VM's QEMU, virtiofsd and
// proxy run as; made now, with a notice, on a host setup has not made it
// on, as start installs what is missing.
func (m *Manager) account(ctx context.Context) (uid, gid int, err error) {
	h := hostpkgs.Host{Run: m.Run}
	uid, gid, ok, err := h.AccountIDs()
	if err != nil || ok {
		return uid, gid, err
	}
	if uid, gid, err = h.CreateAccount(ctx); err != nil {
		return 0, 0, err
	}
	fmt.Fprintf(m.Progress, "agent-vm: made the system account %s (uid %d) that VMs run as, as `agent-vm setup` does\n", hostpkgs.Account, uid)
	return uid, gid, nil
}

// setupNeed is what setup installs: what running VMs need, the backend's
// own needs (a backend.HostNeeder's; "" and auto add none), and the
// tests'.
func (m *Manager) setupNeed(tests bool, name string) (hostpkgs.Need, error) {
	need := hostpkgs.Run | hostpkgs.Image
	if name != "" && name != BackendAuto {
		be, ok := m.Backends[name]
		if !ok {
			return 0, fmt.Errorf("--backend %q: must be auto, qemu, nixos, vagrant or libvirt", name)
		}
		if h, ok := be.(backend.HostNeeder); ok {
			need |= h.HostNeeds()
		}
	}
	if tests {
		need |= hostpkgs.Test
	}
	return need, nil
}

// CheckPrograms is `setup --check`: every program agent-vm (with tests,
// the test suite; with a backend that needs more, that backend) runs.
func (m *Manager) CheckPrograms(tests bool, backendName string) ([]hostsetup.ProgramCheck, error) {
	need, err := m.setupNeed(tests, backendName)
	if err != nil {
		return nil, err
	}
	flag := ""
	if _, ok := m.Backends[backendName].(backend.HostNeeder); ok {
		flag = backendName
	}
	return hostsetup.CheckPrograms(hostpkgs.Host{Run: m.Run}, need, tests, flag)
}
