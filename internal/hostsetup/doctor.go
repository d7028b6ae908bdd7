package hostsetup

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostbrowser"
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
	// Browser is the host's browser, which no VM needs: what a VM's
	// browser doors would reach.
	Browser BrowserReport `json:"browser"`
}

// BrowserReport is doctor's browser section: the Claude in Chrome bridge,
// a Chrome or Chromium, a DevTools endpoint on 127.0.0.1:9222, and the
// way `run --chrome` would take (hostbrowser's Via constants, or "none:"
// and what to do).
type BrowserReport struct {
	Checks []Check `json:"checks"`
	Chrome string  `json:"chrome"`
}

// browserReport turns hostbrowser's facts into doctor's checks.
func browserReport(f hostbrowser.Facts) BrowserReport {
	r := BrowserReport{Chrome: f.Chrome}
	bridgeCheck := Check{Name: "claude in chrome bridge", OK: f.Bridge != "", Detail: f.Bridge}
	if !bridgeCheck.OK {
		bridgeCheck.Detail = f.BridgeProblem
	}
	binary := Check{Name: "chrome/chromium", OK: f.Binary != "" && f.BinaryProblem == "", Detail: f.Binary + " (" + f.Version + ")"}
	if !binary.OK {
		binary.Detail = f.BinaryProblem
	}
	devtools := Check{Name: "devtools 127.0.0.1:9222"}
	if f.DevTools != nil {
		devtools.OK, devtools.Detail = true, f.DevTools.Browser+" answers"
	} else {
		devtools.Detail = f.DevToolsProblem
	}
	r.Checks = []Check{bridgeCheck, binary, devtools}
	return r
}

// Driver is a driver as doctor asks it (driver.Driver has it).
type Driver interface {
	Name() string
	Doctor(ctx context.Context) (checks []driver.Check, ok bool)
}

// Backend is a backend as doctor asks it (backend.Backend has it).
type Backend interface {
	Name() string
	Driver() string
	Doctor(ctx context.Context) backend.Readiness
}

// DoctorInput is what doctor looks at.
type DoctorInput struct {
	Run execx.Runner
	// Drivers are asked in this order, Backends too; Default is the
	// backend `create` picks ("" when none).
	Drivers  []Driver
	Backends []Backend
	Default  string
	Accel    accel.Result
	// ImageDir is the image cache, where the default base image is looked
	// for.
	ImageDir string
	// Extra are the caller's own checks (templates), after the backends'.
	Extra []Check
	// Getenv is the environment the browser's facts are read with
	// (AGENT_VM_CHROME_BRIDGE_DIR; nil: os.Getenv).
	Getenv func(string) string
	// Lookup resolves names as the egress proxies will (nil:
	// net.DefaultResolver).
	Lookup func(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Doctor checks the host: the programs every VM needs (git, then each
// driver's: QEMU, virtiofsd), KVM, then each backend's own needs, the
// caller's checks and the egress proxies' view of the package sources;
// and, apart, the host's browser.
func Doctor(ctx context.Context, in DoctorInput) DoctorReport {
	r := DoctorReport{Backends: []string{}, Backend: in.Default}
	add := func(c Check) bool { r.Checks = append(r.Checks, c); return c.OK }

	gitOK := add(driver.CheckProgram(ctx, in.Run, "git", []string{"--version"}, hostpkgs.InstallHint("git")))
	driverOK := map[string]bool{}
	for _, d := range in.Drivers {
		checks, ok := d.Doctor(ctx)
		for _, c := range checks {
			add(c)
		}
		driverOK[d.Name()] = ok
	}

	acc := in.Accel
	r.Accel, r.AccelReason, r.AccelHint = acc.Accel, acc.Reason, acc.Hint
	if acc.Accel == accel.KVM {
		add(Check{Name: "kvm", OK: true, Detail: acc.Reason})
	} else {
		add(Check{Name: "kvm", Detail: "not usable, VMs run under TCG (software emulation): " + acc.Reason, Hint: acc.Hint})
	}

	for _, be := range in.Backends {
		rd := be.Doctor(ctx)
		for _, c := range rd.Checks {
			add(c)
		}
		if rd.Ready && gitOK && driverOK[be.Driver()] {
			r.Backends = append(r.Backends, be.Name())
		}
	}
	if img, err := image.Lookup(in.ImageDir, image.DefaultBuildName); err == nil {
		r.Image = img.Disk
	}
	for _, c := range in.Extra {
		add(c)
	}
	lookup := in.Lookup
	if lookup == nil {
		lookup = net.DefaultResolver.LookupNetIP
	}
	add(egressCheck(ctx, lookup))
	r.VMReady = slices.Contains(r.Backends, r.Backend)
	getenv := in.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	r.Browser = browserReport(hostbrowser.Doctor(ctx, in.Run, getenv))
	return r
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
