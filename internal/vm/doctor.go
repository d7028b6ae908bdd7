package vm

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
)

// Check is one thing doctor looked at.
type Check = backend.Check

// DoctorReport says what this host can do. It is `doctor --json`.
type DoctorReport struct {
	Checks      []Check `json:"checks"`
	Accel       string  `json:"accel"`
	AccelReason string  `json:"accel_reason"`
	AccelHint   string  `json:"accel_hint,omitempty"`
	Image       string  `json:"image"` // the default base image's disk, "" when none
	// Backends are the backends that can run VMs here; Backend is the one
	// `create` picks (auto).
	Backends []string `json:"backends"`
	Backend  string   `json:"backend"`
	VMReady  bool     `json:"vm_ready"` // the default backend can run VMs here
}

// Doctor checks the host: the programs every VM needs (git, then each
// driver's: QEMU, virtiofsd), KVM, then each backend's own needs.
func (m *Manager) Doctor(ctx context.Context) DoctorReport {
	r := DoctorReport{Backends: []string{}}
	add := func(c Check) bool { r.Checks = append(r.Checks, c); return c.OK }

	gitOK := add(driver.CheckProgram(ctx, m.Run, "git", []string{"--version"}, hostpkgs.InstallHint("git")))
	driverOK := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(m.Drivers)) {
		checks, ok := m.Drivers[name].Doctor(ctx)
		for _, c := range checks {
			add(c)
		}
		driverOK[name] = ok
	}

	acc := m.Accel(ctx)
	r.Accel, r.AccelReason, r.AccelHint = acc.Accel, acc.Reason, acc.Hint
	if acc.Accel == accel.KVM {
		add(Check{Name: "kvm", OK: true, Detail: acc.Reason})
	} else {
		add(Check{Name: "kvm", Detail: "not usable, VMs run under TCG (software emulation): " + acc.Reason, Hint: acc.Hint})
	}

	if def, err := m.resolveBackend(BackendAuto); err == nil {
		r.Backend = def.Name()
	}
	for _, name := range m.backendNames(r.Backend) {
		rd := m.Backends[name].Doctor(ctx)
		for _, c := range rd.Checks {
			add(c)
		}
		if rd.Ready && gitOK && driverOK[m.Backends[name].Driver()] {
			r.Backends = append(r.Backends, name)
		}
	}
	if img, err := image.Lookup(m.ImageDir(), image.DefaultBuildName); err == nil {
		r.Image = img.Disk
	}
	add(m.templateCheck())
	add(egressCheck(ctx, net.DefaultResolver.LookupNetIP))
	r.VMReady = slices.Contains(r.Backends, r.Backend)
	return r
}

// backendNames are the backends this build has: first the default one,
// then the others sorted.
func (m *Manager) backendNames(first string) []string {
	names := make([]string, 0, len(m.Backends))
	for n := range m.Backends {
		if n != first {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	if _, ok := m.Backends[first]; ok {
		names = append([]string{first}, names...)
	}
	return names
}

// packageSources are the hosts a Debian guest fetches from on its first
// boot: apt's mirror (packages, provisioning) and npm's registry (agent
// CLIs).
var packageSources = []string{"deb.debian.org", "registry.npmjs.org"}

// egressCheck resolves the guests' package sources as the VMs' egress
// proxies will: an address the proxy refuses even for an allowed name (one
// that is not globally reachable: a gateway that answers every name with
// its own address, split DNS) leaves every VM without packages until the
// user allows that address. A host that cannot resolve them is offline:
// its VMs are too, which is no finding of this check.
func egressCheck(ctx context.Context, lookup func(ctx context.Context, network, host string) ([]netip.Addr, error)) Check {
	var refused []string
	for _, h := range packageSources {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		addrs, err := lookup(lctx, "ip", h)
		cancel()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			why, err := egress.Unreachable(a)
			if err != nil {
				return Check{Name: "egress", Detail: err.Error()}
			}
			if why != "" {
				refused = append(refused, fmt.Sprintf("%s resolves to %s here, %s", h, a, why))
			}
		}
	}
	if len(refused) == 0 {
		return Check{Name: "egress", OK: true, Detail: "the guests' package sources (" + strings.Join(packageSources, ", ") + ") resolve to addresses the egress proxy reaches"}
	}
	return Check{Name: "egress", Detail: strings.Join(refused, "; ") + ": every VM's egress proxy refuses such an address, even for an allowed name",
		Hint: "if it is your network's gateway, allow it for each VM, before the first boot when that installs packages: `agent-vm net allow BRANCH ADDRESS`"}
}
