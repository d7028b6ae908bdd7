package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostload"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qmp"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// Launcher starts, inspects and stops VMs.
type Launcher struct {
	Run  execx.Runner
	Log  hclog.Logger
	Arch Arch
	// PortFree checks host ports before QEMU tries to bind them.
	PortFree ports.Probe
	// BootTimeout bounds how long QEMU may take to open its QMP socket.
	BootTimeout time.Duration
	// NoSandbox runs QEMU without its seccomp filter
	// (AGENT_VM_QEMU_SANDBOX=off), for a QEMU built without seccomp.
	NoSandbox bool
	// Geteuid is the user agent-vm runs as; nil = os.Geteuid.
	Geteuid func() int
	// Self is the agent-vm binary, which runs the virtiofsd jail; nil =
	// os.Executable.
	Self func() (string, error)
	// Egress holds a directory per VM for the sockets of egress proxies
	// whose QEMU runs as another user, and the relay copy they run
	// (hostdir.Table.Egress: root's, 0711, Shared). Needed only for such
	// VMs.
	Egress *hostdir.Dir
}

// NewLauncher returns a Launcher for the host's architecture.
func NewLauncher(run execx.Runner, log hclog.Logger) (*Launcher, error) {
	a, err := HostArch()
	if err != nil {
		return nil, err
	}
	return &Launcher{Run: run, Log: log, Arch: a, PortFree: ports.Listenable, BootTimeout: 60 * time.Second}, nil
}

// Launch is what Start recorded about a running VM (run/launch.json).
type Launch struct {
	QEMUPid      int `json:"qemu_pid"`
	VirtiofsdPid int `json:"virtiofsd_pid,omitempty"`
	// EgressPid is the VM's egress proxy (driver.Network); 0 for none.
	EgressPid   int              `json:"egress_pid,omitempty"`
	Accel       string           `json:"accel"`
	AccelReason string           `json:"accel_reason,omitempty"`
	Share       driver.ShareMode `json:"share"`
	QMP         string           `json:"qmp"`
	StartedAt   time.Time        `json:"started_at"`
	// ReadyAt is when the guest first answered on SSH after this start
	// (set by MarkReady); nil while it boots.
	ReadyAt *time.Time `json:"ready_at,omitempty"`
	// Netdev is the id of the VM's user-mode netdev (AddForward); "" in
	// a launch of an agent-vm from before port forwards.
	Netdev string `json:"netdev,omitempty"`
}

// MarkReady records that the guest of the current launch is up.
func MarkReady(m Machine, at time.Time) error {
	l, err := readLaunch(m.runFile(LaunchFile))
	if err != nil {
		return err
	}
	at = at.UTC()
	l.ReadyAt = &at
	return writeJSON(m.runFile(LaunchFile), l)
}

// StartOptions are per-start choices.
type StartOptions struct {
	Accel       string // "kvm" or "tcg"
	AccelReason string
	// Virtiofsd to use; nil shares the workspace over 9p.
	Virtiofsd *virtiofsd.Binary
	// NoFallback: when virtiofsd fails, fail the start instead of sharing
	// over 9p (a guest built for virtiofs would boot without its workspace).
	NoFallback bool

	// resume: QEMU waits for a saved state (Resume), without the virtiofs
	// device, which is plugged in once the state is loaded.
	resume bool
	share  driver.ShareMode // resume: the share mode of the saved machine
}

// Start launches the VM detached from the caller (its own session), and
// returns once QEMU answers on QMP. Booting the guest is then under way; the
// caller waits for SSH. On failure nothing of this start keeps running.
func (l *Launcher) Start(ctx context.Context, m Machine, b Boot, o StartOptions) (*Launch, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	if hasSavedState(m) {
		return nil, fmt.Errorf("%s has a saved state (hint: resume it, or stop it to discard the state): %w", m.Name, driver.ErrSuspended)
	}
	return l.start(ctx, m, b, o)
}

// start is Start or, with o.resume, the launch of a Resume.
func (l *Launcher) start(ctx context.Context, m Machine, b Boot, o StartOptions) (*Launch, error) {
	if (b.Direct == nil) == (b.Script == nil) {
		return nil, errors.New("internal error: a boot needs exactly one of Direct and Script")
	}
	h := l.hardening(m, b)
	var egress *hostdir.Dir
	if h.RunAs != nil && m.Network != nil {
		if egress = l.egressDir(m.UUID); egress == nil {
			return nil, errors.New("internal error: the QEMU launcher has no directory for egress sockets")
		}
		m.EgressDir = egress.Path
	}
	if b.Direct != nil {
		if _, err := l.Run.LookPath(l.Arch.Binary); err != nil {
			return nil, fmt.Errorf("%s is not installed, so agent-vm cannot run VMs (hint: install QEMU: `sudo apt-get install %s qemu-utils` on Debian/Ubuntu, `sudo dnf install qemu-kvm qemu-img` on Fedora)", l.Arch.Binary, l.Arch.Package)
		}
		if err := CheckSandbox(ctx, l.Run, l.Arch.Binary, h); err != nil {
			return nil, err
		}
	}
	if h.Sandbox == nil {
		l.Log.Warn("QEMU runs without its seccomp sandbox (AGENT_VM_QEMU_SANDBOX=off)")
	}
	if live, err := l.Inspect(ctx, m); err == nil && live.InPlace() {
		return nil, fmt.Errorf("%s is paused in place (pid %d) (hint: resume it, or stop it): %w", m.Name, live.Pid, driver.ErrSuspended)
	} else if err == nil && live.Alive() {
		return nil, fmt.Errorf("%s is %s (pid %d): %w", m.Name, live.State, live.Pid, driver.ErrRunning)
	}
	if err := l.checkForwards(m); err != nil {
		return nil, err
	}
	if err := checkNetwork(m); err != nil {
		return nil, err
	}
	if err := prepareDirs(m, o.resume); err != nil {
		return nil, err
	}
	if egress != nil {
		if err := egress.Make(); err != nil {
			return nil, fmt.Errorf("creating the egress socket directory: %w", err)
		}
		relay, err := installRelay(l.Egress.Path, m.Network.Relay[0])
		if err != nil {
			return nil, err
		}
		n := *m.Network
		n.Relay = append([]string{relay}, n.Relay[1:]...)
		m.Network = &n
	}
	egressPid := 0
	if m.Network != nil {
		pid, err := l.startEgress(ctx, m, l.proxyOwner(m, h))
		if err != nil {
			return nil, err
		}
		egressPid = pid
	}
	mode := driver.Share9p
	vfsPid := 0
	if o.resume {
		mode = o.share
	} else if o.Virtiofsd != nil {
		pid, err := l.startVirtiofsd(ctx, o.Virtiofsd, m)
		if err != nil {
			if ctx.Err() != nil {
				l.stopEgress(m)
				return nil, ctx.Err()
			}
			if o.NoFallback {
				l.stopEgress(m)
				return nil, fmt.Errorf("sharing the workspace: %w (hint: fix virtiofsd, or recreate the VM on a host without it to use 9p)", err)
			}
			l.Log.Warn("virtiofsd failed; sharing the workspace over 9p instead (slower for many small files)", "error", err)
		} else {
			mode, vfsPid = driver.ShareVirtiofs, pid
		}
	}
	p, err := l.Run.Start(l.detached(m, b, o.Accel, mode, h, o.resume))
	if err != nil {
		l.stopVirtiofsd(m, vfsPid, 0)
		l.stopEgress(m)
		return nil, fmt.Errorf("starting QEMU: %w", err)
	}
	pid, err := l.waitQMP(ctx, m, p)
	if err != nil {
		proc.Kill(p.Pid(), m.isQEMU())
		l.stopVirtiofsd(m, vfsPid, 0)
		l.stopEgress(m)
		return nil, err
	}
	launch := &Launch{QEMUPid: pid, VirtiofsdPid: vfsPid, EgressPid: egressPid, Accel: o.Accel, AccelReason: o.AccelReason,
		Share: mode, QMP: m.QMPPath(), Netdev: b.netdev(), StartedAt: time.Now().UTC()}
	if err := writeJSON(m.runFile(LaunchFile), launch); err != nil {
		return nil, err
	}
	l.Log.Debug("qemu started", "pid", pid, "accel", o.Accel, "share", mode)
	return launch, nil
}

// detached builds the process description for QEMU or the script.
func (l *Launcher) detached(m Machine, b Boot, accelerator string, mode driver.ShareMode, h Hardening, resume bool) execx.Detached {
	if b.Direct != nil {
		return execx.Detached{Path: l.Arch.Binary, Args: directArgv(l.Arch, m, b.Direct, accelerator, mode, h, resume),
			StdoutPath: m.QEMULogPath()}
	}
	env := b.Script.Env
	if opts := ScriptNetOpts(m, b.Script); opts != "" {
		env = append(slices.Clip(env), "QEMU_NET_OPTS="+opts)
	}
	if params := accel.KernelCmdline(accelerator, ""); params != "" {
		// nixpkgs' run script adds QEMU_KERNEL_PARAMS to the kernel's
		// command line.
		env = append(slices.Clip(env), "QEMU_KERNEL_PARAMS="+params)
	}
	return execx.Detached{Path: b.Script.Path, Args: ScriptArgs(m, accelerator, mode, h),
		Env: env, ExactEnv: true, StdoutPath: m.QEMULogPath()}
}

// hardening is how this start confines QEMU. Run as root, a Direct boot's
// QEMU drops to the workspace's owner once it has opened its files (disks,
// kernel, credentials, logs, sockets and the pid file are all opened
// before -runas takes effect; /dev/kvm too), so a QEMU compromised from the
// guest is that user, not root, and a 9p share writes as that user. A
// Script boot keeps the user it was started as: nixpkgs' run script
// prepares directories QEMU opens later.
func (l *Launcher) hardening(m Machine, b Boot) Hardening {
	var h Hardening
	if b.Direct != nil && l.euid() == 0 && m.Share.UID > 0 {
		h.RunAs = &Owner{UID: m.Share.UID, GID: m.Share.GID}
	}
	if !l.NoSandbox {
		p := Sandbox(h.RunAs, m.Network != nil)
		h.Sandbox = &p
	}
	return h
}

// proxyOwner is the user the egress proxy drops to: QEMU's -runas user,
// or, for a root agent-vm whose QEMU keeps root (a NixOS run script), the
// workspace's owner all the same: what parses the guest's requests is
// never root. nil: the proxy stays the caller's user.
func (l *Launcher) proxyOwner(m Machine, h Hardening) *Owner {
	if h.RunAs != nil {
		return h.RunAs
	}
	if l.euid() == 0 && m.Share.UID > 0 {
		return &Owner{UID: m.Share.UID, GID: m.Share.GID}
	}
	return nil
}

func (l *Launcher) euid() int {
	if l.Geteuid != nil {
		return l.Geteuid()
	}
	return os.Geteuid()
}

// checkForwards fails early, with a clear message, when a forwarded port is
// taken (QEMU's own error is cryptic). A port is given a moment to come free:
// a QEMU that just exited (this VM's, before a restart) can hold its
// listening sockets briefly after it is gone from the process table.
func (l *Launcher) checkForwards(m Machine) error {
	for _, f := range m.Forwards {
		if err := ports.CheckForward(f.Host, f.Name, l.PortFree, 3*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// prepareDirs makes the run and log dirs, clears what the last run left and
// keeps one previous console log. A cold start also removes what a suspend
// cut short left of a state (a resume's state is complete: it has its
// record, and Start refuses it).
func prepareDirs(m Machine, resume bool) error {
	for _, d := range []string{m.RunDir, m.LogsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := ensureSocketDir(m); err != nil {
		return err
	}
	for _, f := range []string{m.runFile(PidFile), m.runFile(VirtiofsdPid), m.runFile(LaunchFile), m.runFile(CleanMarker), m.runFile(PauseFile), m.runFile(MemoryFile), m.QMPPath(), m.sockFile(VirtiofsdSock)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if !resume {
		if err := discardSavedState(m); err != nil {
			return err
		}
	}
	if _, err := os.Stat(m.ConsoleLogPath()); err == nil {
		_ = os.Rename(m.ConsoleLogPath(), m.ConsoleLogPath()+".1")
	}
	return nil
}

// waitQMP waits until QEMU answers on its QMP socket, or fails with QEMU's
// own words when it exits first.
func (l *Launcher) waitQMP(ctx context.Context, m Machine, p execx.Process) (int, error) {
	timeout := l.BootTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	load := hostload.Read(0)
	timeout = load.Scale(timeout)
	deadline := time.Now().Add(timeout)
	b := newBackoff(20*time.Millisecond, 250*time.Millisecond)
	for {
		select {
		case <-p.Exited():
			return 0, l.exitError(m, p.ExitCode())
		case <-ctx.Done():
			return 0, ctx.Err()
		default:
		}
		if pid, err := proc.ReadPid(m.runFile(PidFile)); err == nil {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := qmp.Dial(qctx, m.QMPPath())
			cancel()
			if err == nil {
				c.Close()
				// QEMU made the socket under agent-vm's umask; its
				// directory is private already, the socket is too.
				if err := os.Chmod(m.QMPPath(), 0o600); err != nil {
					return 0, fmt.Errorf("restricting the QMP socket: %w", err)
				}
				return pid, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("QEMU did not open its QMP socket within %s (the host: %s); its log %s says: %s", timeout.Round(time.Second), load, m.QEMULogPath(), orNothing(driver.TailFile(m.QEMULogPath(), 5)))
		}
		select {
		case <-p.Exited():
			return 0, l.exitError(m, p.ExitCode())
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(b.next()):
		}
	}
}

var hostfwdRE = regexp.MustCompile(`host forwarding rule 'tcp:127\.0\.0\.1:(\d+)`)

// exitError explains an early QEMU exit from its log.
func (l *Launcher) exitError(m Machine, code int) error {
	log := driver.TailFile(m.QEMULogPath(), 5)
	if sm := hostfwdRE.FindStringSubmatch(log); sm != nil {
		return fmt.Errorf("QEMU could not forward port %s: it is already in use on 127.0.0.1 (hint: start the VM again, which moves a port agent-vm picked; a port you chose is yours to free): %w", sm[1], ports.ErrTaken)
	}
	if strings.Contains(log, "Could not access KVM kernel module") || strings.Contains(log, "failed to initialize kvm") {
		return fmt.Errorf("QEMU could not use KVM: %s (hint: set AGENT_VM_ACCEL=tcg to run without it)", log)
	}
	return fmt.Errorf("QEMU exited at once (code %d); its log %s says:\n%s", code, m.QEMULogPath(), orNothing(log))
}

func orNothing(s string) string {
	if s == "" {
		return "(nothing)"
	}
	return s
}

// writeJSON replaces a run file durably: a host crash must not leave a torn
// launch.json (see Inspect for what is done with one all the same).
func writeJSON(path string, v any) error { return atomicfile.WriteJSON(path, v, 0o600) }

func readLaunch(path string) (*Launch, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var l Launch
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &l, nil
}
