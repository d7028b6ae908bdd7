package hostsetup

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostbrowser"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/pins"
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
	// browser bridges would reach.
	Browser BrowserReport `json:"browser"`
	// Pins are the host's pins (`agent-vm setup`), recorded in PinsFile;
	// PackageSources the names setup pins when they need it (Sources).
	Pins           []egress.Pin `json:"pins"`
	PinsFile       string       `json:"pins_file"`
	PackageSources []string     `json:"package_sources"`
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
	// net.DefaultResolver); Own lists the host's own addresses (nil:
	// egress.HostAddrs).
	Lookup pins.Lookup
	Own    func() ([]netip.Addr, error)
	// Pins is the host's pins file; nil: none.
	Pins *pins.File
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

	if os.Geteuid() == 0 {
		add(accountCheck(hostpkgs.Host{Run: in.Run}))
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
	r.PinsFile, r.PackageSources = in.Pins.Path(), Sources(in.ImageDir)
	pinned, err := in.Pins.Read()
	r.Pins = pinned
	var answers []pins.Answer
	if err == nil {
		answers, err = resolveSources(ctx, r.PackageSources, in.Lookup, in.Own)
	}
	add(egressCheck(answers, pinned, err))
	r.VMReady = slices.Contains(r.Backends, r.Backend)
	getenv := in.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	r.Browser = browserReport(hostbrowser.Doctor(ctx, in.Run, getenv))
	return r
}

// accountCheck is doctor's line, as root, on agent-vm's account
// (hostpkgs.Account), which the VMs root starts run as: made or not yet
// (setup, or the first create, makes it), or why it cannot serve.
func accountCheck(h hostpkgs.Host) Check {
	c := Check{Name: "account " + hostpkgs.Account}
	uid, gid, ok, err := h.AccountIDs()
	switch {
	case err != nil:
		c.Detail = err.Error()
	case ok:
		c.OK, c.Detail = true, fmt.Sprintf("uid %d, gid %d: QEMU, virtiofsd and the egress proxy of the VMs root starts run as it", uid, gid)
	default:
		c.OK, c.Detail = true, "not made yet: `agent-vm setup` (or the first create as root) makes it"
	}
	return c
}
