package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/libvirtnet"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qemuuser"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
	"github.com/agent-vm/agent-vm/internal/virtpool"
)

// DriverName is the libvirt driver's name, as backends name it.
const DriverName = "libvirt"

// Boot is the libvirt driver's plan: the base image a VM's root disk is
// an overlay of, its cloud-init seed, and the NIC's MAC the seed's
// network configuration matches.
type Boot struct {
	Image Image
	// DiskBytes is the root overlay's size, made once per VM.
	DiskBytes uint64
	Seed      string // the seed ISO, a local file, put in the pool at each start
	MAC       string
}

// DriverName implements driver.Boot.
func (Boot) DriverName() string { return DriverName }

// Files of a machine, in its run directory (RunDir), its logs directory
// and its handoff directory.
const (
	LaunchFile    = "libvirt-launch.json"
	CleanMarker   = "clean-shutdown"
	SuspendMark   = "suspended"
	ConsoleLog    = "console.log"
	ForwardLog    = "forward.log"
	VirtiofsdSock = virtiofsd.SocketFile
	VirtiofsdLog  = virtiofsd.LogFile
	FwCfgDir      = "fw_cfg"
	// NetFile is the VM's network as its start made it (libvirtnet.Net):
	// the guest's address the forwards lead to.
	NetFile = "libvirt-net.json"
)

// Driver runs machines on this machine's system libvirtd (qemu:///system),
// as root. See the package doc.
type Driver struct {
	Run execx.Runner
	Log hclog.Logger
	// Handoff is where the files libvirt's QEMU opens that are not
	// volumes go, a directory per machine: the workspace's virtiofsd
	// socket and the credential copies it reads through fw_cfg
	// (hostdir.Table.Handoff). nil refuses every start.
	Handoff *hostdir.Dir
	// Pool is the directory of agent-vm's storage pool on the host;
	// PoolName its name ("": virtpool.DefaultName).
	Pool, PoolName string
	// QEMUUser is the user libvirt runs QEMU as ("" is
	// qemuuser.DefaultUser).
	QEMUUser string
	// Executable is the agent-vm binary that runs the forwards
	// (`net-forward`); nil = os.Executable.
	Executable func() (string, error)
	// Euid is the user agent-vm runs as; nil = os.Geteuid.
	Euid func() int
	// PortFree says whether a host port can be bound; nil = ports.Listenable.
	PortFree ports.Probe
}

var (
	_ driver.Driver           = (*Driver)(nil)
	_ driver.Suspender        = (*Driver)(nil)
	_ driver.NetworkContainer = (*Driver)(nil)
	_ driver.Forwarder        = (*Driver)(nil)
	_ driver.Placer           = (*Driver)(nil)
)

// Name implements driver.Driver.
func (d *Driver) Name() string { return DriverName }

// ContainsNetwork makes the driver a driver.NetworkContainer: every
// machine it runs is on a libvirt network of its own, fenced, behind its
// egress proxy (internal/libvirtnet).
func (d *Driver) ContainsNetwork() {}

// SuspendKeepsShare implements driver.Suspender: Suspend pauses the
// domain, whose QEMU keeps the share (libvirt refuses to save a domain
// with a virtiofs share).
func (d *Driver) SuspendKeepsShare() bool { return true }

func (d *Driver) euid() int {
	if d.Euid == nil {
		return os.Geteuid()
	}
	return d.Euid()
}

func (d *Driver) qemuUser() string {
	if d.QEMUUser == "" {
		return qemuuser.DefaultUser
	}
	return d.QEMUUser
}

// errNeedsRoot is a start refused to another user than root.
var errNeedsRoot = errors.New("the libvirt backend runs VMs on the system libvirtd, each on a libvirt network and behind an nftables table of its own, which only root can make (hint: run agent-vm as root, e.g. with sudo; the qemu backend needs no root)")

// DomainName is m's libvirt domain, and its network's name: the VM's name
// and the start of its uuid, so that VMs of two state directories with
// one name never meet on the host.
func DomainName(m driver.Machine) string {
	if m.UUID == "" {
		return m.Name
	}
	return m.Name + "-" + libvirtnet.ID(m.UUID)
}

// connect opens this machine's system libvirtd.
func (d *Driver) connect() (Host, func(), error) {
	l := golibvirt.NewWithDialer(dialers.NewLocal())
	if err := l.ConnectToURI(golibvirt.QEMUSystem); err != nil {
		return Host{}, nil, fmt.Errorf("connecting to libvirt (qemu:///system): %w (hint: is libvirtd running? `systemctl start libvirtd`, or `agent-vm setup`)", err)
	}
	h := Host{L: l, Run: d.Run, URI: string(golibvirt.QEMUSystem), Pool: virtpool.Pool{L: l, Dir: d.Pool, Name: d.PoolName}}
	return h, func() { _ = l.Disconnect() }, nil
}

func (d *Driver) containment() libvirtnet.Containment {
	return libvirtnet.Containment{Libvirt: libvirtnet.Libvirt{Run: d.Run, URI: string(golibvirt.QEMUSystem)}, Run: d.Run, Log: d.Log, Euid: d.Euid}
}

func runFile(m driver.Machine, name string) string { return filepath.Join(m.RunDir, name) }

// handoff is m's directory of the files libvirt's QEMU opens.
func (d *Driver) handoff(m driver.Machine) *hostdir.Dir { return d.Handoff.Sub(DomainName(m), 0o711) }

func (d *Driver) shareSocket(m driver.Machine) string {
	return filepath.Join(d.handoff(m).Path, VirtiofsdSock)
}

// qemuPidFile is where libvirt keeps the pid of m's QEMU.
func qemuPidFile(m driver.Machine) string { return "/run/libvirt/qemu/" + DomainName(m) + ".pid" }

// Start makes m's network, share, forwards and domain and starts it (see
// the package doc). A failed start leaves nothing of its own running; the
// root disk stays.
func (d *Driver) Start(ctx context.Context, m driver.Machine, b driver.Boot, o driver.StartOptions) (*driver.Launch, error) {
	boot, err := driver.PlanOf[Boot](DriverName, b)
	if err != nil {
		return nil, err
	}
	if m.Remote != nil {
		return d.startRemote(ctx, m, boot, o)
	}
	if d.euid() != 0 {
		return nil, fmt.Errorf("starting %s: %w", m.Name, errNeedsRoot)
	}
	if m.Network == nil || d.Handoff == nil || d.Pool == "" || m.UUID == "" {
		return nil, fmt.Errorf("internal error: the libvirt driver runs only contained machines with a handoff directory, a pool and a uuid (network %v, handoff %v, pool %q, uuid %q)", m.Network != nil, d.Handoff != nil, d.Pool, m.UUID)
	}
	seed, err := os.ReadFile(boot.Seed)
	if err != nil {
		return nil, fmt.Errorf("starting %s: the seed: %w", m.Name, err)
	}
	h, lv, done, err := d.live(m)
	if err != nil {
		return nil, err
	}
	defer done()
	switch {
	case lv.State == driver.StateSuspended:
		return nil, fmt.Errorf("starting %s: %w", m.Name, driver.ErrSuspended)
	case lv.Alive():
		return nil, fmt.Errorf("starting %s: %w", m.Name, driver.ErrRunning)
	}
	d.cleanup(m) // what a crash left: its forwarder, virtiofsd, proxy and fence
	if err := d.checkPortsFree(m); err != nil {
		return nil, err
	}
	if err := d.handoff(m).Sub(FwCfgDir, 0o711).Make(); err != nil {
		return nil, fmt.Errorf("making the directory libvirt's QEMU opens %s's files in: %w", m.Name, err)
	}
	creds, err := d.handCredentials(m)
	if err != nil {
		return nil, err
	}
	launch := &driver.Launch{Accel: o.Accel, AccelReason: o.AccelReason, Share: driver.ShareVirtiofs, StartedAt: time.Now().UTC()}
	if err := atomicfile.WriteJSON(runFile(m, LaunchFile), launch, 0o600); err != nil {
		return nil, err
	}
	_ = os.Remove(runFile(m, CleanMarker))
	fail := func(err error) (*driver.Launch, error) {
		d.undoStart(h, m)
		return nil, fmt.Errorf("starting %s: %w", m.Name, err)
	}
	if launch.SharePid, err = d.startShare(ctx, m); err != nil {
		return fail(err)
	}
	name := DomainName(m)
	net, err := d.containment().Contain(ctx, m, name, boot.MAC)
	if err != nil {
		return fail(err)
	}
	typ := "qemu"
	if o.Accel == "kvm" {
		typ = "kvm"
	}
	mm := Machine{Name: name, UUID: m.UUID, Type: typ, CPUs: m.CPUs, MemoryMiB: m.MemoryMiB, DiskBytes: boot.DiskBytes,
		MAC: boot.MAC, ProxyAddr: net.ProxyAddr, Console: filepath.Join(m.LogsDir, ConsoleLog),
		Share: &Share{Socket: d.shareSocket(m), Tag: m.Share.Tag}, FwCfg: creds}
	if _, err := h.Up(ctx, mm, boot.Image, seed); err != nil {
		return fail(err)
	}
	launch.Pid, _ = proc.ReadPid(qemuPidFile(m))
	if err := atomicfile.WriteJSON(runFile(m, NetFile), net, 0o600); err != nil {
		return fail(err)
	}
	for _, f := range m.Forwards {
		if err := d.startForward(ctx, m, net.Guest, f); err != nil {
			return fail(err)
		}
	}
	if err := atomicfile.WriteJSON(runFile(m, LaunchFile), launch, 0o600); err != nil {
		return fail(err)
	}
	_ = os.Remove(runFile(m, SuspendMark))
	return launch, nil
}

// handCredentials copies m's credentials into its handoff directory,
// readable by libvirt's QEMU alone, and names them for fw_cfg.
func (d *Driver) handCredentials(m driver.Machine) ([]FwCfg, error) {
	uid, ok := qemuuser.Lookup(d.qemuUser())
	if !ok {
		return nil, fmt.Errorf("starting %s: there is no user %s for libvirt's QEMU to hand the VM's credentials to (hint: is libvirt-daemon-system installed? `agent-vm setup`)", m.Name, d.qemuUser())
	}
	var out []FwCfg
	for _, c := range m.Credentials {
		cp := filepath.Join(d.handoff(m).Path, FwCfgDir, c.Name)
		if err := qemuuser.CopyFor(c.File, cp, uid); err != nil {
			return nil, fmt.Errorf("starting %s: handing credential %s to libvirt's QEMU (user %s): %w", m.Name, c.Name, d.qemuUser(), err)
		}
		out = append(out, FwCfg{Name: "opt/io.systemd.credentials/" + c.Name, File: cp})
	}
	return out, nil
}

// startShare starts agent-vm's jailed virtiofsd for the workspace and
// hands its socket to libvirt's QEMU alone; libvirt only connects QEMU to
// it (an externally launched virtiofsd), so the share never runs as root
// unjailed.
func (d *Driver) startShare(ctx context.Context, m driver.Machine) (int, error) {
	v, err := virtiofsd.Find(ctx, d.Run)
	if err != nil {
		return 0, fmt.Errorf("sharing the workspace: %w", err)
	}
	if !v.Jailed(d.euid(), m.Share) {
		return 0, fmt.Errorf("sharing the workspace: agent-vm cannot run virtiofsd in its jail here (%s is not QEMU's C virtiofsd, or the workspace's owner is unknown: uid %d), and unjailed as root it would let the guest's root create root-owned and setuid files in %s on the host (hint: install QEMU's C virtiofsd, Debian 12's qemu-system-common; for an unknown owner, recreate the VM)", v.Path, m.Share.UID, m.Share.Source)
	}
	sock := d.shareSocket(m)
	pid, err := virtiofsd.Start(ctx, d.Run, v, virtiofsd.Spec{Share: m.Share, Socket: sock, Log: filepath.Join(m.LogsDir, VirtiofsdLog)}, virtiofsd.Options{Geteuid: d.Euid, Self: d.Executable})
	if err != nil {
		return 0, fmt.Errorf("sharing the workspace: %w", err)
	}
	if err := qemuuser.GiveSocket(sock, d.qemuUser(), d.Log); err != nil {
		virtiofsd.Kill(pid, sock)
		return 0, fmt.Errorf("sharing the workspace: %w", err)
	}
	return pid, nil
}

// cleanup ends what a start of m made besides the domain: the forwarder,
// virtiofsd, and the contained network (proxy, fence, libvirt network).
// Best effort: it runs after a stop, a crash or a failed start.
func (d *Driver) cleanup(m driver.Machine) {
	d.stopForwards(m, 0)
	if d.Handoff != nil {
		virtiofsd.Kill(0, d.shareSocket(m))
	}
	if m.UUID != "" {
		d.containment().Uncontain(m, DomainName(m))
	}
}

// undoStart forces off what a failed start made (without the caller's
// ctx, which may be what failed it).
func (d *Driver) undoStart(h Host, m driver.Machine) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Shutdown(ctx, DomainName(m), 0); err != nil {
		d.Log.Warn("could not force the domain off after its failed start", "vm", m.Name, "error", err)
	}
	d.cleanup(m)
	_ = atomicfile.Write(runFile(m, CleanMarker), nil, 0o600)
}

// Inspect implements driver.Driver, from libvirt's state of the domain
// and the driver's run files.
func (d *Driver) Inspect(ctx context.Context, m driver.Machine) (driver.Live, error) {
	if m.Remote != nil {
		lv, _, err := d.inspectRemote(ctx, m)
		return lv, err
	}
	_, lv, done, err := d.live(m)
	if err != nil {
		return driver.Live{}, err
	}
	done()
	return lv, nil
}

// live connects to the host and reads m's live state, for a verb; done
// ends the connection.
func (d *Driver) live(m driver.Machine) (Host, driver.Live, func(), error) {
	h, done, err := d.connect()
	if err != nil {
		return Host{}, driver.Live{}, nil, err
	}
	lv, err := d.inspect(h, m)
	if err != nil {
		done()
		return Host{}, driver.Live{}, nil, err
	}
	return h, lv, done, nil
}

func (d *Driver) inspect(h Host, m driver.Machine) (driver.Live, error) {
	var lv driver.Live
	if b, err := os.ReadFile(runFile(m, LaunchFile)); err == nil {
		var l driver.Launch
		if err := json.Unmarshal(b, &l); err != nil {
			lv.LaunchErr = fmt.Errorf("%s: %w", runFile(m, LaunchFile), err)
		} else {
			lv.Launch = &l
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		lv.LaunchErr = err
	}
	st, reason, err := h.State(DomainName(m))
	if err != nil {
		return lv, err
	}
	lv.State, lv.Suspend, lv.Detail = stateOf(st, reason, lv.Launch != nil, exists(runFile(m, CleanMarker)), exists(runFile(m, SuspendMark)))
	if lv.HasProcess() {
		lv.Pid, _ = proc.ReadPid(qemuPidFile(m))
		if lv.Suspend == driver.SuspendPaused && lv.Pid > 0 {
			lv.Resident, _ = proc.ResidentBytes(lv.Pid)
		}
	}
	return lv, nil
}

// stateOf is a machine's state, how a suspended one keeps its memory, and
// why, from libvirt's state and reason of its domain and the driver's
// marks: launched (a start recorded a launch), clean (agent-vm's stop or
// a failed start ended it), suspended (agent-vm's suspend paused it). A
// domain that is shut off without a clean stop of agent-vm's, and not by
// its guest powering off, crashed (a killed QEMU is "destroyed" to
// libvirt).
func stateOf(st golibvirt.DomainState, reason int32, launched, clean, suspended bool) (state, suspend, detail string) {
	switch st {
	case golibvirt.DomainRunning, golibvirt.DomainBlocked, golibvirt.DomainShutdown, golibvirt.DomainPmsuspended:
		// DomainShutdown: being shut down, its QEMU still there.
		return driver.StateRunning, "", ""
	case golibvirt.DomainPaused:
		if suspended {
			return driver.StateSuspended, driver.SuspendPaused, "paused in place: its QEMU holds its memory"
		}
		return driver.StatePaused, "", ""
	case golibvirt.DomainCrashed:
		return driver.StateCrashed, "", "libvirt says the domain crashed"
	case golibvirt.DomainShutoff:
		if golibvirt.DomainShutoffReason(reason) == golibvirt.DomainShutoffShutdown {
			return driver.StateStopped, "", "guest powered itself off"
		}
		if launched && !clean {
			return driver.StateCrashed, "", fmt.Sprintf("its QEMU ended without a clean shutdown (libvirt's reason: %s)", shutoffReason(reason))
		}
	}
	return driver.StateStopped, "", ""
}

func shutoffReason(r int32) string {
	switch golibvirt.DomainShutoffReason(r) {
	case golibvirt.DomainShutoffDestroyed:
		return "destroyed"
	case golibvirt.DomainShutoffCrashed:
		return "crashed"
	case golibvirt.DomainShutoffFailed:
		return "failed to start"
	case golibvirt.DomainShutoffDaemon:
		return "libvirtd restarted without it"
	}
	return "unknown"
}

// isQEMU matches a QEMU process (libvirt's pid file names it).
func isQEMU(args []string) bool {
	return len(args) > 0 && strings.HasPrefix(filepath.Base(args[0]), "qemu-system-")
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// Stop shuts m down (ACPI, forced after grace); a suspended machine is
// forced off at once. What the start made besides the domain goes with it.
func (d *Driver) Stop(ctx context.Context, m driver.Machine, grace time.Duration) error {
	if m.Remote != nil {
		defer d.stopForwards(m, 0)
		_, err := d.onHost(ctx, m, hostRequest{Verb: verbStop, Grace: grace})
		return err
	}
	h, lv, done, err := d.live(m)
	if err != nil {
		return err
	}
	defer done()
	defer func() {
		d.cleanup(m)
		_ = os.Remove(runFile(m, SuspendMark))
		_ = atomicfile.Write(runFile(m, CleanMarker), nil, 0o600)
	}()
	if !lv.HasProcess() {
		return fmt.Errorf("stopping %s: %w", m.Name, driver.ErrNotRunning)
	}
	if lv.State == driver.StateSuspended {
		grace = 0
	}
	return h.Shutdown(ctx, DomainName(m), grace)
}

// Destroy removes m's domain, volumes, network and handoff directory.
func (d *Driver) Destroy(ctx context.Context, m driver.Machine) error {
	if m.Remote != nil {
		d.stopForwards(m, 0)
		_, err := d.onHost(ctx, m, hostRequest{Verb: verbDestroy})
		return err
	}
	h, done, err := d.connect()
	if err != nil {
		return err
	}
	defer done()
	d.cleanup(m)
	err = h.Remove(ctx, DomainName(m))
	if d.Handoff != nil {
		err = errors.Join(err, os.RemoveAll(d.handoff(m).Path))
	}
	return err
}

// Suspend pauses the running domain in place (its QEMU keeps the memory
// and the share).
func (d *Driver) Suspend(ctx context.Context, m driver.Machine, _ driver.GuestHooks) error {
	if m.Remote != nil {
		_, err := d.onHost(ctx, m, hostRequest{Verb: verbSuspend})
		return err
	}
	h, lv, done, err := d.live(m)
	if err != nil {
		return err
	}
	defer done()
	if lv.State != driver.StateRunning {
		return fmt.Errorf("suspending %s: %w", m.Name, driver.ErrNotRunning)
	}
	dom, err := h.L.DomainLookupByName(DomainName(m))
	if err != nil {
		return err
	}
	if err := atomicfile.Write(runFile(m, SuspendMark), nil, 0o600); err != nil {
		return err
	}
	if err := h.L.DomainSuspend(dom); err != nil {
		_ = os.Remove(runFile(m, SuspendMark))
		return fmt.Errorf("pausing the libvirt domain %s: %w", DomainName(m), err)
	}
	return nil
}

// Resume runs a domain Suspend paused again.
func (d *Driver) Resume(ctx context.Context, m driver.Machine, _ driver.Boot, o driver.StartOptions) (*driver.Launch, error) {
	if m.Remote != nil {
		res, err := d.onHost(ctx, m, hostRequest{Verb: verbResume, Options: o})
		return res.Launch, err
	}
	h, lv, done, err := d.live(m)
	if err != nil {
		return nil, err
	}
	defer done()
	if lv.State != driver.StateSuspended {
		return nil, fmt.Errorf("resuming %s: %w", m.Name, driver.ErrNotRunning)
	}
	dom, err := h.L.DomainLookupByName(DomainName(m))
	if err != nil {
		return nil, err
	}
	if err := h.L.DomainResume(dom); err != nil {
		return nil, fmt.Errorf("running the libvirt domain %s again: %w", DomainName(m), err)
	}
	_ = os.Remove(runFile(m, SuspendMark))
	return lv.Launch, nil
}

// MarkReady implements driver.Driver.
func (d *Driver) MarkReady(m driver.Machine, at time.Time) error {
	if m.Remote != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := d.onHost(ctx, m, hostRequest{Verb: verbReady, At: at})
		return err
	}
	b, err := os.ReadFile(runFile(m, LaunchFile))
	if err != nil {
		return err
	}
	var l driver.Launch
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	at = at.UTC()
	l.ReadyAt = &at
	return atomicfile.WriteJSON(runFile(m, LaunchFile), l, 0o600)
}

// Running reports whether the QEMU of launch l still runs (the pid
// libvirt keeps, checked against the one the start recorded).
func (d *Driver) Running(m driver.Machine, l *driver.Launch) bool {
	if m.Remote != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		lv, err := d.Inspect(ctx, m)
		return err == nil && lv.HasProcess() && (l == nil || lv.Launch == nil || lv.Launch.StartedAt.Equal(l.StartedAt))
	}
	pid, err := proc.ReadPid(qemuPidFile(m))
	if err != nil || pid <= 0 || (l != nil && l.Pid > 0 && pid != l.Pid) {
		return false
	}
	return proc.Verified(pid, isQEMU)
}

// Logs are the serial console and libvirt's log of the domain's QEMU:
// for a machine placed on another host, paths there.
func (d *Driver) Logs(m driver.Machine) driver.Logs {
	if m.Remote != nil {
		// On the host, in the machine's directory there.
		return driver.Logs{Console: path.Join(hostDirs(m.Remote.Dir, m).Logs, ConsoleLog), Driver: "/var/log/libvirt/qemu/" + DomainName(m) + ".log"}
	}
	return driver.Logs{Console: filepath.Join(m.LogsDir, ConsoleLog), Driver: "/var/log/libvirt/qemu/" + DomainName(m) + ".log"}
}

// Share implements driver.Driver: agent-vm's own virtiofsd, always.
func (d *Driver) Share(ctx context.Context) (driver.ShareMode, error) {
	if _, err := virtiofsd.Find(ctx, d.Run); err != nil {
		return driver.ShareVirtiofs, err
	}
	return driver.ShareVirtiofs, nil
}
