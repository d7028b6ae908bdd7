package vm

import (
	"context"
	"path/filepath"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// DefaultStateDir is $XDG_DATA_HOME/agent-vms, i.e. ~/.local/share/agent-vms.
func DefaultStateDir(getenv func(string) string) string {
	return hostdir.XDG(getenv, "XDG_DATA_HOME", filepath.Join(".local", "share"), "agent-vms")
}

// ProbeAccel decides between KVM and TCG once per host boot (cached), by
// running the QEMU binary qemuBin: the accelerator is a QEMU matter, which
// is why the composition root (internal/wire) names the binary.
func (m *Manager) ProbeAccel(ctx context.Context, qemuBin string) accel.Result {
	return m.Prober(qemuBin).Probe(ctx)
}

// Prober is the accelerator probe of the QEMU binary qemuBin, with its
// cache in agent-vm's host cache.
func (m *Manager) Prober(qemuBin string) *accel.Prober {
	qemuPath, err := m.Run.LookPath(qemuBin)
	if err != nil {
		qemuPath = qemuBin
	}
	kernels, _ := filepath.Glob(filepath.Join(m.ImageDir(), "*", "vmlinuz*"))
	kernels = append(kernels, "/run/current-system/kernel")
	return &accel.Prober{Run: m.Run, QEMU: qemuPath, Kernels: kernels, CacheDir: m.Dirs.Cache, Override: m.Getenv("AGENT_VM_ACCEL")}
}
