package qemu

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// DriverName is the name backends give the QEMU driver.
const DriverName = "qemu"

// DriverName says that a Boot is the QEMU driver's plan.
func (Boot) DriverName() string { return DriverName }

// Driver is the QEMU launcher behind the driver contract: it turns the
// neutral machine description into the launcher's (adding the socket
// directory) and the launcher's results into the neutral ones.
type Driver struct {
	Launcher *Launcher
	// FindVirtiofsd finds virtiofsd; an error means 9p.
	FindVirtiofsd func(ctx context.Context) (*virtiofsd.Binary, error)
}

// The QEMU driver has every capability but Placer and ForeignReacher (see
// internal/driver and docs/ARCHITECTURE.md's capability table).
var (
	_ driver.Driver           = (*Driver)(nil)
	_ driver.Suspender        = (*Driver)(nil)
	_ driver.Pauser           = (*Driver)(nil)
	_ driver.Hibernator       = (*Driver)(nil)
	_ driver.Cloner           = (*Driver)(nil)
	_ driver.Forwarder        = (*Driver)(nil)
	_ driver.Adopter          = (*Driver)(nil)
	_ driver.NetworkContainer = (*Driver)(nil)
)

// NewDriver returns the driver over l, finding virtiofsd with l's runner.
func NewDriver(l *Launcher) *Driver {
	return &Driver{Launcher: l, FindVirtiofsd: func(ctx context.Context) (*virtiofsd.Binary, error) { return virtiofsd.Find(ctx, l.Run) }}
}

// Name is "qemu".
func (d *Driver) Name() string { return DriverName }

// ContainsNetwork makes the driver a driver.NetworkContainer: Start runs
// the egress proxy and the exposed ports of Machine.Network behind a restricted
// user-mode network.
func (d *Driver) ContainsNetwork() {}

// SuspendKeepsShare is false: a saved state cannot hold the share's
// device, so Suspend unplugs it (after GuestHooks.Detach) and Resume plugs
// it back for the caller to mount.
func (d *Driver) SuspendKeepsShare() bool { return false }

// adopted is what Adopt learnt (driver.Machine.Adopted): where the running
// QEMU's sockets are.
type adopted struct{ socketDir string }

// machine is m as the launcher sees it: with its socket directory, which is
// the run directory when the uuid is unknown (see Adopt).
func (d *Driver) machine(m driver.Machine) Machine {
	if a, ok := m.Adopted.(adopted); ok {
		return Machine{Machine: m, SocketDir: a.socketDir}
	}
	if m.UUID == "" {
		return Machine{Machine: m, SocketDir: m.RunDir}
	}
	return Machine{Machine: m, SocketDir: SocketDirFor(m.RunDir, m.UUID)}
}

// Doctor checks QEMU, qemu-img and virtiofsd (optional: without it the
// workspace is shared over 9p). ok is whether QEMU runs.
func (d *Driver) Doctor(ctx context.Context) ([]driver.Check, bool) {
	bin := d.Launcher.Arch.Binary
	checks := []driver.Check{
		driver.CheckProgram(ctx, d.Launcher.Run, bin, []string{"--version"}, hostpkgs.InstallHint(bin)),
		driver.CheckProgram(ctx, d.Launcher.Run, "qemu-img", []string{"--version"}, hostpkgs.InstallHint("qemu-img")),
	}
	checks = append(checks, d.sandboxCheck(ctx, checks[0].OK))
	if v, err := d.FindVirtiofsd(ctx); err != nil {
		checks = append(checks, driver.Check{Name: "virtiofsd", Detail: "not found: the workspace is shared over 9p (slower for many small files)", Hint: hostpkgs.InstallHint("virtiofsd")})
	} else {
		kind := "QEMU's C virtiofsd"
		if v.Rust {
			kind = "the Rust virtiofsd"
		}
		checks = append(checks, driver.Check{Name: "virtiofsd", OK: true, Detail: v.Path + " (" + kind + ")"})
	}
	return checks, checks[0].OK
}

// sandboxCheck says whether QEMU accepts agent-vm's seccomp policy (a
// failing check does not stop doctor: start refuses with the same words).
// It checks the policy of a start: every VM's network has guestfwd commands
// (its proxy and exposed ports), so QEMU may spawn them.
func (d *Driver) sandboxCheck(ctx context.Context, haveQEMU bool) driver.Check {
	c := driver.Check{Name: "QEMU sandbox"}
	policy := Sandbox(nil, true)
	switch {
	case d.Launcher.NoSandbox:
		c.Detail = "off (AGENT_VM_QEMU_SANDBOX=off): QEMU runs without its seccomp filter"
		c.Hint = "unset AGENT_VM_QEMU_SANDBOX to turn it back on"
	case !haveQEMU:
		c.Detail = "not checked: QEMU is missing"
	default:
		if err := CheckSandbox(ctx, d.Launcher.Run, d.Launcher.Arch.Binary, Hardening{Sandbox: &policy}); err != nil {
			c.Detail = err.Error()
		} else {
			c.OK, c.Detail = true, "-sandbox "+policy.Option()
		}
	}
	return c
}

// Share is virtiofs when virtiofsd is found, else 9p (err says why).
func (d *Driver) Share(ctx context.Context) (driver.ShareMode, error) {
	if _, err := d.FindVirtiofsd(ctx); err != nil {
		return driver.Share9p, err
	}
	return driver.ShareVirtiofs, nil
}

// Inspect reads the VM's state from its pid and QMP (Launcher.Inspect).
func (d *Driver) Inspect(ctx context.Context, m driver.Machine) (driver.Live, error) {
	lv, err := d.Launcher.Inspect(ctx, d.machine(m))
	if err != nil {
		return driver.Live{}, err
	}
	return driver.Live{State: lv.State, Detail: lv.Detail, Suspend: lv.Suspend, Pid: lv.Pid, Resident: lv.Resident, Launch: lv.Launch.neutral(), LaunchErr: lv.LaunchErr}, nil
}

// Start runs a Boot (Launcher.Start), with virtiofsd when o.Share is
// virtiofs. Any other plan is refused.
func (d *Driver) Start(ctx context.Context, m driver.Machine, b driver.Boot, o driver.StartOptions) (*driver.Launch, error) {
	boot, err := driver.PlanOf[Boot](DriverName, b)
	if err != nil {
		return nil, err
	}
	so := StartOptions{Accel: o.Accel, AccelReason: o.AccelReason, NoFallback: o.FixedShare}
	if o.Share == driver.ShareVirtiofs {
		v, err := d.FindVirtiofsd(ctx)
		switch {
		case err != nil && o.FixedShare:
			return nil, fmt.Errorf("sharing the workspace: %w", err)
		case err != nil:
			d.Launcher.Log.Warn("sharing the workspace over 9p", "reason", err)
		}
		so.Virtiofsd = v
	}
	launch, err := d.Launcher.Start(ctx, d.machine(m), boot, so)
	if err != nil {
		return nil, err
	}
	return launch.neutral(), nil
}

// Stop shuts the VM down (Launcher.Stop).
func (d *Driver) Stop(ctx context.Context, m driver.Machine, grace time.Duration) error {
	return d.Launcher.Stop(ctx, d.machine(m), grace)
}

// Suspend saves the VM and ends its QEMU (Launcher.Suspend).
func (d *Driver) Suspend(ctx context.Context, m driver.Machine, g driver.GuestHooks) error {
	v, _ := d.FindVirtiofsd(ctx) // to plug the share in again if it must be undone
	return d.Launcher.Suspend(ctx, d.machine(m), g, v)
}

// Pause stops the running VM's CPUs in place (Launcher.Pause).
func (d *Driver) Pause(ctx context.Context, m driver.Machine) error {
	return d.Launcher.Pause(ctx, d.machine(m))
}

// Hibernate pauses the running VM and moves its memory to disk
// (Launcher.Hibernate).
func (d *Driver) Hibernate(ctx context.Context, m driver.Machine) error {
	return d.Launcher.Hibernate(ctx, d.machine(m))
}

// Continue runs a VM Pause or Hibernate paused again (Launcher.Continue).
func (d *Driver) Continue(ctx context.Context, m driver.Machine) (*driver.Launch, error) {
	launch, err := d.Launcher.Continue(ctx, d.machine(m))
	if err != nil {
		return nil, err
	}
	return launch.neutral(), nil
}

// Resume starts the VM from its saved state (Launcher.Resume). Any other
// plan than the QEMU driver's is refused.
func (d *Driver) Resume(ctx context.Context, m driver.Machine, b driver.Boot, o driver.StartOptions) (*driver.Launch, error) {
	boot, so, err := d.restoreOptions(ctx, b, o)
	if err != nil {
		return nil, err
	}
	launch, err := d.Launcher.Resume(ctx, d.machine(m), boot, so)
	if err != nil {
		return nil, err
	}
	return launch.neutral(), nil
}

// Adopt completes m from the QEMU running in its run directory (see the
// function Adopt); m is returned as it was when none runs.
func (d *Driver) Adopt(ctx context.Context, m driver.Machine) driver.Machine {
	am, pid := Adopt(d.machine(m))
	if pid == 0 {
		return m
	}
	out := am.Machine
	out.Adopted = adopted{socketDir: am.SocketDir}
	return out
}

// Destroy removes the VM's socket directory when it lives outside the run
// directory (long state paths, see SocketDirFor): only ever the one
// SocketDirFor names for this VM. It is best effort; nothing else is kept
// outside the VM's directories.
func (d *Driver) Destroy(ctx context.Context, m driver.Machine) error {
	sock := d.machine(m).SocketDir
	if m.UUID == "" || sock != SocketDirFor(m.RunDir, m.UUID) || sock == m.RunDir {
		return nil
	}
	_ = os.RemoveAll(sock)
	return nil
}

// AddForward adds a forward to the running VM (Launcher.AddForward).
func (d *Driver) AddForward(ctx context.Context, m driver.Machine, f driver.Forward) error {
	return d.Launcher.AddForward(ctx, d.machine(m), f)
}

// RemoveForward ends a forward of the running VM (Launcher.RemoveForward).
func (d *Driver) RemoveForward(ctx context.Context, m driver.Machine, f driver.Forward) error {
	return d.Launcher.RemoveForward(ctx, d.machine(m), f)
}

// MarkReady records that the guest of the current launch is up.
func (d *Driver) MarkReady(m driver.Machine, at time.Time) error { return MarkReady(d.machine(m), at) }

// Running reports whether the QEMU launched as l still runs.
func (d *Driver) Running(m driver.Machine, l *driver.Launch) bool {
	return l != nil && Running(d.machine(m), l.Pid)
}

// Logs are the serial console and QEMU's own log.
func (d *Driver) Logs(m driver.Machine) driver.Logs {
	qm := d.machine(m)
	return driver.Logs{Console: qm.ConsoleLogPath(), Driver: qm.QEMULogPath()}
}

// neutral is the launch as the driver contract reports it.
func (l *Launch) neutral() *driver.Launch {
	if l == nil {
		return nil
	}
	return &driver.Launch{Pid: l.QEMUPid, SharePid: l.VirtiofsdPid, Accel: l.Accel, AccelReason: l.AccelReason,
		Share: l.Share, StartedAt: l.StartedAt, ReadyAt: l.ReadyAt}
}

// Clone starts a machine that never ran from a template's saved state
// (Launcher.Clone).
func (d *Driver) Clone(ctx context.Context, m driver.Machine, b driver.Boot, o driver.StartOptions, from driver.Machine, edits []driver.MemoryEdit) (*driver.Launch, error) {
	boot, so, err := d.restoreOptions(ctx, b, o)
	if err != nil {
		return nil, err
	}
	launch, err := d.Launcher.Clone(ctx, d.machine(m), boot, so, d.machine(from), edits)
	if err != nil {
		return nil, err
	}
	return launch.neutral(), nil
}

// restoreOptions are a Resume's or a Clone's plan and options: the share
// is plugged in after the restore, over virtiofs when there is one, with
// no fallback to 9p (the saved guest expects virtiofs).
func (d *Driver) restoreOptions(ctx context.Context, b driver.Boot, o driver.StartOptions) (Boot, StartOptions, error) {
	boot, err := driver.PlanOf[Boot](DriverName, b)
	if err != nil {
		return Boot{}, StartOptions{}, err
	}
	so := StartOptions{Accel: o.Accel, AccelReason: o.AccelReason, NoFallback: true}
	if v, err := d.FindVirtiofsd(ctx); err == nil {
		so.Virtiofsd = v
	}
	return boot, so, nil
}
