package vm

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
)

// Check is one thing doctor looked at.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Hint   string `json:"hint,omitempty"`
}

// DoctorReport says what this host can do. It is `doctor --json`.
type DoctorReport struct {
	Checks      []Check `json:"checks"`
	Accel       string  `json:"accel"`
	AccelReason string  `json:"accel_reason"`
	AccelHint   string  `json:"accel_hint,omitempty"`
	Image       string  `json:"image"`    // the default base image's disk, "" when none
	VMReady     bool    `json:"vm_ready"` // qemu and a base image are there
}

// Doctor checks the host: the programs agent-vm runs, KVM, the base image.
func (m *Manager) Doctor(ctx context.Context) DoctorReport {
	imageDir := m.imageDir
	var r DoctorReport
	add := func(c Check) bool { r.Checks = append(r.Checks, c); return c.OK }

	add(m.program(ctx, "git", []string{"--version"}, installHint("git")))
	qemuOK := add(m.program(ctx, m.Launcher.Arch.Binary, []string{"--version"}, installHint(m.Launcher.Arch.Binary)))
	add(m.program(ctx, "qemu-img", []string{"--version"}, installHint("qemu-img")))
	if v, err := m.FindVirtiofsd(ctx); err != nil {
		add(Check{Name: "virtiofsd", Detail: "not found: the workspace is shared over 9p (slower for many small files)", Hint: "install virtiofsd (Debian 12: qemu-system-common; newer: virtiofsd)"})
	} else {
		kind := "QEMU's C virtiofsd"
		if v.Rust {
			kind = "the Rust virtiofsd"
		}
		add(Check{Name: "virtiofsd", OK: true, Detail: v.Path + " (" + kind + ")"})
	}

	acc := m.Accel(ctx)
	r.Accel, r.AccelReason, r.AccelHint = acc.Accel, acc.Reason, acc.Hint
	if acc.Accel == accel.KVM {
		add(Check{Name: "kvm", OK: true, Detail: acc.Reason})
	} else {
		add(Check{Name: "kvm", Detail: "not usable, VMs run under TCG (software emulation): " + acc.Reason, Hint: acc.Hint})
	}

	if img, err := image.Lookup(imageDir, image.DefaultBuildName); err == nil {
		r.Image = img.Disk
		add(Check{Name: "base image", OK: true, Detail: fmt.Sprintf("%s (%s, built %s)", img.Disk, img.Name, img.Manifest.Created.Format("2006-01-02"))})
	} else {
		add(Check{Name: "base image", Detail: "none in " + imageDir,
			Hint: "build it: `sudo agent-vm image build` (about 2 minutes), or `agent-vm image pull debian-12` and create VMs with --image"})
	}
	mmde := m.program(ctx, "mmdebstrap", []string{"--version"}, "to build images: "+installHint("mmdebstrap"))
	if mmde.OK && os.Geteuid() != 0 {
		mmde.Detail += "; building images needs root"
	}
	mmde.Name = "mmdebstrap (image build)"
	add(mmde)
	nix := m.program(ctx, "nix", []string{"--version"}, "only the nixos backend needs it: https://nixos.org/download")
	nix.Name = "nix (nixos backend)"
	add(nix)
	r.VMReady = qemuOK && r.Image != ""
	return r
}

// installHint says how to get a program: setup, and its package from
// hostpkgs' list (the one place that names packages).
func installHint(name string) string {
	p, err := hostpkgs.Lookup(name)
	if err != nil {
		return "install " + name
	}
	return "`sudo agent-vm setup` installs it (" + p.PackageHint() + ")"
}

// program checks that a program runs and reports its version line.
func (m *Manager) program(ctx context.Context, name string, args []string, hint string) Check {
	p, err := m.Run.LookPath(name)
	if err != nil {
		return Check{Name: name, Detail: "not found", Hint: hint}
	}
	res, err := m.Run.Run(ctx, execx.Cmd{Path: p, Args: args})
	if err != nil {
		return Check{Name: name, Detail: p + ": " + err.Error(), Hint: hint}
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(res.Stdout)), "\n")
	return Check{Name: name, OK: true, Detail: p + " (" + line + ")"}
}
