package vagrant

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/flock"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// DriverName is the name backends give the Vagrant driver.
const DriverName = "vagrant"

// DefaultURI is the libvirt connection vagrant-libvirt uses.
const DefaultURI = "qemu:///system"

// Files of the driver: ProjectDir in the run directory holds the
// Vagrantfile and vagrant's dotfile directory; the rest are agent-vm's.
const (
	ProjectDir  = "vagrant"
	DotDir      = ".vagrant"
	LaunchFile  = "vagrant-launch.json"
	CacheFile   = "vagrant-status.json"
	LockFile    = "vagrant.lock"
	CleanMarker = "clean-shutdown"
	SuspendMark = "suspended"
	ConsoleLog  = "console.log"
	VagrantLog  = "vagrant.log"
)

// Boot is the vagrant backend's plan: what its guest needs of the
// Vagrantfile besides the machine itself.
type Boot struct {
	Box string // the Vagrant box
	// BoxVersion is the box's version; "" takes whichever vagrant has.
	BoxVersion string
	// Guest is the box's guest OS as vagrant names it ("debian"), when
	// agent-vm knows it; "" has vagrant detect it.
	Guest string
	// Cmdline is the kernel command line of a box that boots its kernel
	// directly (agent-vm's own: the image's); "" for a box with a
	// bootloader of its own, whose command line agent-vm leaves alone.
	Cmdline string
	Seed    string // the cloud-init NoCloud seed ISO
	MAC     string // the management NIC's MAC, which the seed matches
	SSHUser string // the guest user vagrant logs in as
	SSHKey  string // its private key (the VM's client key)
	// User, when set, is the repository's own Vagrantfile, run as is: the
	// rest of the plan is unused (see the package doc).
	User *UserProject
}

// DriverName says that a Boot is the Vagrant driver's plan.
func (Boot) DriverName() string { return DriverName }

// Driver runs machines with vagrant and vagrant-libvirt.
type Driver struct {
	Run execx.Runner
	Log hclog.Logger
	// Progress receives vagrant's output while a lifecycle command runs.
	Progress io.Writer
	// Home is VAGRANT_HOME: agent-vm's, shared by its VMs (see the
	// package doc).
	Home string
	// URI is the libvirt connection; "" = DefaultURI.
	URI string
	// QEMUUser is the user libvirt runs QEMU as; "" = qemuuser.DefaultUser.
	QEMUUser string
	// HostRoot is where Doctor looks for /dev/kvm and /etc/group; "" = /
	// (tests point it at a directory of their own).
	HostRoot string
	// Handoff, when set, is a directory outside home directories in which
	// each machine gets its own directory (MachineName) for every file
	// libvirt's QEMU opens: the seed, the credential copies and the
	// virtiofsd socket. "" keeps them in the VM's run and logs
	// directories, which QEMU's user must then be able to reach (see
	// prepareAccess). As root agent-vm sets it (hostdir.Table.Handoff):
	// root's state directory is under /root, which is 0700. nil: none.
	Handoff *hostdir.Dir
	// PidDir is libvirt's directory of QEMU pid files; "" = PidDir.
	PidDir string
	// PortFree probes a host port before vagrant up; nil =
	// ports.Listenable.
	PortFree ports.Probe
	Now      func() time.Time
	// Euid is the user agent-vm runs as; nil = os.Geteuid (tests: a
	// contained start as another user).
	Euid func() int
}

// The vagrant driver suspends (a pause) and contains the network
// (contain.go), but clones no template, adds no forward to a running
// machine (vagrant forwards what the Vagrantfile says) and adopts nothing
// (vagrant's state is in the VM's directory).
var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Suspender = (*Driver)(nil)
)

// Name is "vagrant".
func (d *Driver) Name() string { return DriverName }

// SuspendKeepsShare is true: Suspend pauses the machine (see Suspend), so
// the workspace stays mounted in the guest and nothing is unplugged.
func (d *Driver) SuspendKeepsShare() bool { return true }

func (d *Driver) uri() string {
	if d.URI == "" {
		return DefaultURI
	}
	return d.URI
}

func (d *Driver) now() time.Time {
	if d.Now == nil {
		return time.Now()
	}
	return d.Now()
}

// Project is the directory of a machine's Vagrantfile (VAGRANT_CWD).
func Project(runDir string) string { return filepath.Join(runDir, ProjectDir) }

// MachineName is the vagrant machine's name. For agent-vm's own
// Vagrantfile it is the libvirt domain's too: agent-vm-<slug>-<first 8 of
// the uuid>, unique per host; a machine whose record is lost (no uuid) is
// found by the one machine vagrant keeps in its dotfile directory. For the
// repository's own Vagrantfile it is the one machine that file defines.
func MachineName(m driver.Machine) string {
	if u, ok, _ := userOf(m); ok {
		return u.Machine
	}
	if m.UUID != "" {
		return UniqueName(m.Name, m.UUID)
	}
	entries, _ := os.ReadDir(filepath.Join(Project(m.RunDir), DotDir, "machines"))
	if len(entries) == 1 {
		return entries[0].Name()
	}
	return m.Name
}

// UniqueName is name made unique per host with the first 8 hex digits of
// the machine's uuid: agent-vm-<slug>-0123abcd.
func UniqueName(name, uuid string) string {
	hex := strings.ReplaceAll(uuid, "-", "")
	return name + "-" + hex[:min(8, len(hex))]
}

// domain is the libvirt domain of m: its machine name, or for the
// repository's own Vagrantfile (whose domain vagrant-libvirt names after
// the project directory) the id vagrant recorded in its dotfile directory.
func domain(m driver.Machine) string {
	u, ok, _ := userOf(m)
	if !ok {
		return MachineName(m)
	}
	id, err := os.ReadFile(filepath.Join(Project(m.RunDir), DotDir, "machines", u.Machine, "libvirt", "id"))
	if err != nil {
		return u.Machine
	}
	return strings.TrimSpace(string(id))
}

// Env is the environment of every vagrant command for m: its own project
// and machine state, agent-vm's VAGRANT_HOME (see the package doc); for the
// repository's own Vagrantfile, UserEnv.
func (d *Driver) Env(m driver.Machine) ([]string, error) {
	p := Project(m.RunDir)
	u, ok, err := userOf(m)
	if err != nil {
		return nil, err
	}
	if ok {
		if _, err := os.Stat(u.Vagrantfile); err != nil {
			return nil, fmt.Errorf("%s runs the repository's Vagrantfile %s, and vagrant cannot act on its machine without it: %w (hint: restore the file, e.g. with git checkout, then try again)", m.Name, u.Vagrantfile, err)
		}
		return append(UserEnv(u, filepath.Join(p, DotDir), d.Home), "LIBVIRT_DEFAULT_URI="+d.uri()), nil
	}
	env := []string{"VAGRANT_CWD=" + p, "VAGRANT_VAGRANTFILE=Vagrantfile", "VAGRANT_DOTFILE_PATH=" + filepath.Join(p, DotDir),
		"VAGRANT_CHECKPOINT_DISABLE=1", "VAGRANT_DEFAULT_PROVIDER=libvirt", "LIBVIRT_DEFAULT_URI=" + d.uri()}
	if d.Home != "" {
		env = append(env, "VAGRANT_HOME="+d.Home)
	}
	return env, nil
}

// vagrant runs one vagrant command for m. Its output goes to the VM's
// vagrant.log, and with stream to Progress too; a failure names the
// command and the log.
func (d *Driver) vagrant(ctx context.Context, m driver.Machine, stream bool, args ...string) (execx.Result, error) {
	logPath := filepath.Join(m.LogsDir, VagrantLog)
	env, err := d.Env(m)
	if err != nil {
		return execx.Result{}, err
	}
	cmd := execx.Cmd{Path: "vagrant", Args: args, Dir: Project(m.RunDir), Env: env}
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return execx.Result{}, fmt.Errorf("opening vagrant's log: %w", err)
	}
	defer log.Close()
	fmt.Fprintf(log, "== %s %s\n", d.now().UTC().Format(time.RFC3339), cmd.String())
	var out io.Writer = log
	if stream && d.Progress != nil {
		out = io.MultiWriter(log, d.Progress)
	}
	lines := termsafe.NewLineWriter(out) // vagrant's \r progress, collapsed
	defer lines.Close()
	cmd.Stdout, cmd.Stderr = lines, lines
	if args[0] != "status" {
		// vagrant's own machine lock fails a second command at once;
		// agent-vm's waits (agent-vm's per-VM lock already serialises its
		// verbs; this also covers a caller without it).
		lock, err := flock.Acquire(ctx, runFile(m, LockFile), 0o600, func() {
			d.Log.Info("waiting for another vagrant command on this VM to end", "vm", m.Name)
		})
		if err != nil {
			return execx.Result{}, fmt.Errorf("locking %s for vagrant: %w", m.Name, err)
		}
		defer lock.Release()
	}
	res, err := d.Run.Run(ctx, cmd)
	if err != nil {
		return res, fmt.Errorf("`vagrant %s` failed for %s: %w (hint: vagrant's output is in %s)", strings.Join(args, " "), m.Name, err, logPath)
	}
	return res, nil
}

// Write renders v into m's project directory (atomically, 0600).
func Write(runDir string, v Vagrantfile) error {
	b, err := Render(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(Project(runDir), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(Project(runDir), "Vagrantfile"), b, 0o600)
}

// DefaultBox was the name records of VMs created before the box got its
// image's name and version (internal/vagrantbox) hold for agent-vm's own
// box; read it as "agent-vm's own".
const DefaultBox = "agent-vm/debian-12"

// SpecOf is the Vagrantfile of machine m booted per b with the
// accelerator and share of o, over libvirt connection uri, with the
// virtiofsd socket in the VM's run directory (Start moves it to the
// machine's handoff directory when the driver has one; create writes this
// as the VM's first Vagrantfile, for the user to read). The console log
// stays in the VM's logs directory: libvirt's virtlogd (root) writes it,
// not QEMU (seen: virtlogd holds the file, QEMU a pipe).
func SpecOf(m driver.Machine, b Boot, o driver.StartOptions, uri string) Vagrantfile {
	v := Vagrantfile{Name: MachineName(m), Box: b.Box, BoxVersion: b.BoxVersion, Guest: b.Guest, CPUs: m.CPUs, MemoryMiB: m.MemoryMiB, Driver: DomainKVM, URI: uri,
		Share: runFile(m, VirtiofsdSock),
		SSH:   SSH{User: b.SSHUser, KeyFile: b.SSHKey}, MAC: b.MAC, Seed: b.Seed,
		Console: filepath.Join(m.LogsDir, ConsoleLog)}
	if o.Accel == accel.TCG {
		v.Driver = DomainQEMU
		if b.Cmdline != "" {
			v.Cmdline = accel.KernelCmdline(o.Accel, b.Cmdline)
		}
	}
	// vagrant up waits for the guest's SSH as long as the orchestration
	// would (vagrant's default, 300 s, is too short for a first boot
	// under TCG on a busy host: seen).
	v.BootTimeout = int(o.BootTimeout.Seconds())
	for _, f := range m.Forwards {
		v.Forwards = append(v.Forwards, Forward{ID: f.Name, Host: f.Host, Guest: f.Guest})
	}
	for _, c := range m.Credentials {
		v.FwCfg = append(v.FwCfg, FwCfg{Name: "opt/io.systemd.credentials/" + c.Name, File: c.File})
	}
	return v
}

// Start writes the Vagrantfile and brings the machine up: `vagrant up`
// (which also recovers a crashed one), or `vagrant resume` for a machine
// paused by something else than agent-vm. A machine suspended by agent-vm
// is ErrSuspended (Resume it, or Stop it first). Any other plan is
// refused.
func (d *Driver) Start(ctx context.Context, m driver.Machine, b driver.Boot, o driver.StartOptions) (*driver.Launch, error) {
	boot, err := driver.PlanOf[Boot](DriverName, b)
	if err != nil {
		return nil, err
	}
	if boot.User == nil && m.Network != nil && d.euid() != 0 {
		return nil, fmt.Errorf("starting %s: %w", m.Name, errNeedsRoot)
	}
	var v Vagrantfile
	args := []string{"up", "--no-color"}
	if boot.User != nil {
		// The Vagrantfile (or the user's environment) names the provider.
		if err := WriteUser(m.RunDir, *boot.User); err != nil {
			return nil, err
		}
	} else {
		args = []string{"up", "--provider=libvirt", "--no-color"}
		if m, boot, err = d.prepareAccess(m, boot); err != nil {
			return nil, err
		}
		v = SpecOf(m, boot, o, d.uri())
		v.Share = d.shareSocket(m)
		if err := Write(m.RunDir, v); err != nil {
			return nil, err
		}
	}
	lv, err := d.fresh(ctx, m)
	if err != nil {
		return nil, err
	}
	switch {
	case lv.State == driver.StateSuspended:
		return nil, fmt.Errorf("starting %s: %w", m.Name, driver.ErrSuspended)
	case lv.Alive() && lv.State != driver.StatePaused:
		return nil, fmt.Errorf("starting %s: %w", m.Name, driver.ErrRunning)
	}
	if err := d.checkPortsFree(m); err != nil {
		return nil, err
	}
	if boot.User == nil && m.Network != nil {
		// The Vagrantfile again, now with the VM's network.
		net, err := d.contain(ctx, m, boot.MAC)
		if err != nil {
			return nil, err
		}
		v.Network, v.NetworkAddress = net.Name, net.Subnet.String()
		if err := Write(m.RunDir, v); err != nil {
			d.uncontain(m)
			return nil, err
		}
	}
	launch := &driver.Launch{Accel: o.Accel, AccelReason: o.AccelReason, Share: o.Share, StartedAt: d.now().UTC()}
	if boot.User == nil {
		launch.Share = driver.ShareVirtiofs // the only share (startShare)
	}
	if err := writeJSON(runFile(m, LaunchFile), launch); err != nil {
		d.uncontain(m)
		return nil, err
	}
	removeMarkers(m, CleanMarker)
	if lv.State == driver.StatePaused {
		args = []string{"resume", "--no-color"} // its QEMU, and virtiofsd, still run
	} else if boot.User == nil {
		if err := d.startShare(ctx, m); err != nil {
			d.uncontain(m)
			return nil, err
		}
	}
	if _, err := d.vagrant(ctx, m, true, append(args, MachineName(m))...); err != nil {
		d.undoStart(m)
		return nil, err
	}
	if err := d.VerifyForwards(ctx, m, fmt.Sprintf("`agent-vm start %s` again", short(m))); err != nil {
		d.undoStart(m)
		return nil, fmt.Errorf("starting %s: %w", m.Name, err)
	}
	removeMarkers(m, SuspendMark) // one a crash of a suspended machine left
	return launch, nil
}

// undoStart halts what a failed start left (best effort, without the
// caller's ctx, which may be what failed it).
func (d *Driver) undoStart(m driver.Machine) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := d.vagrant(ctx, m, false, "halt", "--force", "--no-color", MachineName(m)); err != nil {
		d.Log.Warn("could not halt the machine after its failed start", "vm", m.Name, "error", err)
	}
	d.stopShare(m)
	d.uncontain(m)
	_ = touch(runFile(m, CleanMarker))
}

// Stop halts the machine (`vagrant halt`), forcing it off after grace. A
// suspended machine (paused, its QEMU holding its memory) is forced off at
// once: its suspended state is discarded.
func (d *Driver) Stop(ctx context.Context, m driver.Machine, grace time.Duration) error {
	lv, err := d.fresh(ctx, m)
	if err != nil {
		return err
	}
	defer func() {
		_ = touch(runFile(m, CleanMarker))
		removeMarkers(m, SuspendMark, CacheFile)
		d.stopShare(m)
		d.uncontain(m)
	}()
	if lv.State == driver.StateSuspended {
		_, err := d.vagrant(ctx, m, true, "halt", "--force", "--no-color", MachineName(m))
		return err
	}
	if !lv.Alive() {
		return fmt.Errorf("stopping %s: %w", m.Name, driver.ErrNotRunning)
	}
	hctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	if _, err := d.vagrant(hctx, m, true, "halt", "--no-color", MachineName(m)); err == nil || ctx.Err() != nil {
		return err
	}
	_, err = d.vagrant(ctx, m, true, "halt", "--force", "--no-color", MachineName(m))
	return err
}

// Suspend pauses the machine (`vagrant suspend` with suspend_mode
// "pause"): no guest code runs, but its QEMU keeps the memory (libvirt
// refuses managedsave while the workspace share is mounted, see the package
// doc). vagrant exits 0 even when libvirt refused, so the state is read
// again afterwards and a machine still running is an error. The guest's
// hooks are not run: a paused guest keeps its workspace mounted and its
// agent-mcp running, which go on where they were at resume
// (SuspendKeepsShare).
func (d *Driver) Suspend(ctx context.Context, m driver.Machine, _ driver.GuestHooks) error {
	lv, err := d.fresh(ctx, m)
	if err != nil {
		return err
	}
	if lv.State != driver.StateRunning {
		return fmt.Errorf("suspending %s (%s): %w", m.Name, lv.State, driver.ErrNotRunning)
	}
	if err := touch(runFile(m, SuspendMark)); err != nil {
		return err
	}
	if _, err := d.vagrant(ctx, m, true, "suspend", "--no-color", MachineName(m)); err != nil {
		removeMarkers(m, SuspendMark)
		return err
	}
	if lv, err = d.fresh(ctx, m); err != nil || lv.State != driver.StateSuspended {
		removeMarkers(m, SuspendMark)
		if err == nil {
			err = fmt.Errorf("`vagrant suspend` succeeded but the machine is %s (hint: vagrant's output is in %s)", lv.State, d.Logs(m).Driver)
		}
		return fmt.Errorf("suspending %s: %w", m.Name, err)
	}
	return nil
}

// Resume continues a suspended (or paused) machine (`vagrant resume`)
// and returns its launch as after Start, not yet ready: vagrant-libvirt
// starts its port forwards again without waiting for them, so the caller
// waits for the guest and then calls MarkReady. The machine is the one
// that was paused: b is only checked to be the vagrant driver's plan (the
// Vagrantfile is not rewritten), and o's accelerator and share are the
// launch's, as Start recorded them.
func (d *Driver) Resume(ctx context.Context, m driver.Machine, b driver.Boot, o driver.StartOptions) (*driver.Launch, error) {
	if _, err := driver.PlanOf[Boot](DriverName, b); err != nil {
		return nil, err
	}
	lv, err := d.fresh(ctx, m)
	if err != nil {
		return nil, err
	}
	switch lv.State {
	case driver.StateSuspended, driver.StatePaused:
	case driver.StateRunning:
		return nil, fmt.Errorf("resuming %s: %w", m.Name, driver.ErrRunning)
	default:
		return nil, fmt.Errorf("resuming %s: it is %s, not suspended: %w", m.Name, lv.State, driver.ErrNotRunning)
	}
	if err := d.checkPortsFree(m); err != nil {
		return nil, fmt.Errorf("%w (%s stays suspended)", err, m.Name)
	}
	if _, err := d.vagrant(ctx, m, true, "resume", "--no-color", MachineName(m)); err != nil {
		return nil, err
	}
	removeMarkers(m, SuspendMark)
	if err := d.VerifyForwards(ctx, m, fmt.Sprintf("`agent-vm stop %s` and `agent-vm start %s`; the VM runs meanwhile", short(m), short(m))); err != nil {
		return nil, fmt.Errorf("resuming %s: %w", m.Name, err)
	}
	launch := lv.Launch
	if launch == nil { // a record lost since the start: what this resume knows
		launch = &driver.Launch{Accel: o.Accel, AccelReason: o.AccelReason, Share: o.Share, StartedAt: d.now().UTC()}
	}
	launch.ReadyAt = nil
	if err := writeJSON(runFile(m, LaunchFile), launch); err != nil {
		return nil, fmt.Errorf("%s resumed, but recording its launch failed: %w", m.Name, err)
	}
	return launch, nil
}

// Destroy removes the libvirt domain and its disks (`vagrant destroy -f`)
// and the machine's handoff directory; a machine vagrant never created is
// nothing to do.
func (d *Driver) Destroy(ctx context.Context, m driver.Machine) error {
	if err := d.destroy(ctx, m); err != nil {
		return err
	}
	d.uncontain(m)
	if d.Handoff != nil {
		if err := os.RemoveAll(d.handoffDir(m).Path); err != nil {
			return fmt.Errorf("removing %s's files for libvirt's QEMU: %w", m.Name, err)
		}
	}
	return nil
}

func (d *Driver) destroy(ctx context.Context, m driver.Machine) error {
	if !exists(filepath.Join(Project(m.RunDir), "Vagrantfile")) && !exists(filepath.Join(Project(m.RunDir), UserFile)) {
		return nil
	}
	if u, ok, _ := userOf(m); ok {
		// vagrant records a machine's id once it made it: without one
		// there is nothing to destroy, and no need for the repository's
		// Vagrantfile (which may be gone).
		if ids, _ := filepath.Glob(filepath.Join(Project(m.RunDir), DotDir, "machines", u.Machine, "*", "id")); len(ids) == 0 {
			return nil
		}
	}
	st, err := d.status(ctx, m)
	if err != nil {
		return err
	}
	if st.State == "not_created" {
		return nil
	}
	_, err = d.vagrant(ctx, m, true, "destroy", "-f", "--no-color", MachineName(m))
	d.stopShare(m)
	return err
}

// MarkReady records in the launch record when the guest came up.
func (d *Driver) MarkReady(m driver.Machine, at time.Time) error {
	var l driver.Launch
	if err := readJSON(runFile(m, LaunchFile), &l); err != nil {
		return err
	}
	at = at.UTC()
	l.ReadyAt = &at
	return writeJSON(runFile(m, LaunchFile), &l)
}

// Running asks libvirt (virsh domstate, fast) whether the machine's domain
// still runs; when libvirt cannot say, it is assumed to.
func (d *Driver) Running(m driver.Machine, _ *driver.Launch) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := d.Run.Run(ctx, execx.Cmd{Path: "virsh", Args: []string{"-c", d.uri(), "domstate", domain(m)}})
	if err != nil {
		return true
	}
	s := strings.TrimSpace(string(res.Stdout))
	return s != "shut off" && s != "crashed"
}

// Logs are the serial console and vagrant's output.
func (d *Driver) Logs(m driver.Machine) driver.Logs {
	return driver.Logs{Console: filepath.Join(m.LogsDir, ConsoleLog), Driver: filepath.Join(m.LogsDir, VagrantLog)}
}

func runFile(m driver.Machine, name string) string { return filepath.Join(m.RunDir, name) }

// qemuFile is where the file name that libvirt's QEMU opens lives: in the
// machine's handoff directory when the driver has one (see Handoff), else
// in dir, the VM's own.
func (d *Driver) qemuFile(m driver.Machine, dir, name string) string {
	if d.Handoff == nil {
		return filepath.Join(dir, name)
	}
	return filepath.Join(d.handoffDir(m).Path, name)
}

// handoffMode is the mode of a machine's directory in Handoff and of its
// fw_cfg directory: libvirt's QEMU passes through them to the seed and
// the credential copies; nobody lists them.
const handoffMode = 0o711

// handoffDir is the machine's directory in Handoff.
func (d *Driver) handoffDir(m driver.Machine) *hostdir.Dir {
	return d.Handoff.Sub(MachineName(m), handoffMode)
}

func removeMarkers(m driver.Machine, names ...string) {
	for _, n := range names {
		_ = os.Remove(runFile(m, n))
	}
}

func touch(path string) error { return atomicfile.Write(path, nil, 0o600) }
