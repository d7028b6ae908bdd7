// Package libvirtd is a test fixture: a libvirt daemon answering on
// qemu:///system, for the tests that drive vagrant-libvirt for real. It
// installs nothing: the programs come from internal/hostpkgs (need
// Vagrant), which `agent-vm setup --tests` installs.
//
// When a libvirtd already answers (`virsh -c qemu:///system version`), the
// fixture uses it and stops nothing. Otherwise it starts virtlogd and
// libvirtd itself, directly, as the test's own daemons (CI machines and
// containers run no systemd), waits until libvirtd answers, and on Stop
// tears down what its daemon started (running domains, active networks)
// and then the two daemons, by pid. Nothing else is touched. Tests call
// ForTest; Start and Stop are the same without a testing.TB.
//
// What outlives the daemons by design: libvirt's empty top-level iptables
// chains (LIBVIRT_INP, LIBVIRT_FWX, ...), created with its first network,
// and the storage pool "default" (/var/lib/libvirt/images) that
// vagrant-libvirt defines persistently on its first `vagrant up`; a real
// installation has both too. Volumes in that pool are the test's to delete.
//
// What libvirtd needs without systemd, found on Debian 12 (libvirt 9.0.0,
// QEMU 7.2) as root in a container:
//
//   - Only root can start the system daemon; it creates /run/libvirt and
//     its sockets itself (no directory needs preparing). Non-root clients
//     need polkit or the libvirt group (unix_sock_group) on a system whose
//     libvirtd was started by its init; the fixture does not try.
//   - virtlogd must run before a domain starts (qemu.conf's default
//     stdio_handler "logd"); virtlockd is not needed (lock_manager is nop).
//   - Without D-Bus libvirtd logs errors about the system bus, firewalld,
//     udev DMI data and dmidecode (/dev/mem): all harmless.
//   - The Debian package defines the "default" network (virbr0) without
//     autostart; the fixture never starts it. vagrant-libvirt creates and
//     starts its own management network, "vagrant-libvirt" (192.168.121.0/24,
//     NAT), on first `vagrant up`, with dnsmasq (Debian package dnsmasq-base,
//     only a Recommends of libvirt-daemon-system, so listed on its own) for
//     DHCP, and iptables rules; `vagrant destroy` of the last domain on it
//     removes it again. vagrant-libvirt cannot do without it: its
//     ssh_info is the guest's address from that network's DHCP leases (or
//     from a qemu guest agent), so user-mode networking alone leaves vagrant
//     with no address to SSH to. Creating a bridge needs CAP_NET_ADMIN,
//     which root in this container has.
//   - QEMU runs as libvirt-qemu (Debian's qemu.conf default): every file a
//     domain opens by path (kernel, initrd, seed ISO, serial log, shared
//     folders) must be reachable through directories that user may enter.
//     libvirt chowns the files themselves (dynamic_ownership), never their
//     directories: a t.TempDir() (0700) or a home directory (/root is 0700,
//     and Debian 12's adduser makes homes 0700 too) stops QEMU with
//     "Permission denied".
package libvirtd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// URI is the libvirt connection the fixture serves and vagrant-libvirt uses
// by default.
const URI = "qemu:///system"

// Programs the fixture runs, by their hostpkgs names.
const (
	Virsh    = "virsh"
	Libvirtd = "libvirtd"
	Virtlogd = "virtlogd"
)

// Options says how to start the daemons.
type Options struct {
	// Run runs virsh and starts the daemons.
	Run execx.Runner
	// Paths of the programs (hostpkgs finds them); empty means the name.
	Virsh, Libvirtd, Virtlogd string
	// LogDir receives virtlogd.log and libvirtd.log of daemons the fixture
	// starts.
	LogDir string
	// Timeout bounds the wait for libvirtd to answer; 0 means 60 s.
	Timeout time.Duration
	// Root is where /run/libvirt is looked for ("" = /); tests only.
	Root string
}

// Daemon is a libvirtd that answers on URI.
type Daemon struct {
	// Started says the fixture started libvirtd (and virtlogd): Stop stops
	// them. False: a libvirtd was already answering and Stop leaves it be.
	Started bool
	// Version is what `virsh version` printed.
	Version string

	opts     Options
	procs    []started // in start order
	networks []string  // networks active before our libvirtd started
	domains  []string  // domains running before our libvirtd started
}

type started struct {
	name, log string
	proc      execx.Process
}

// Start returns a libvirtd answering on URI: the one already running, or
// virtlogd and libvirtd started here. Its errors name what failed and the
// fix, with the daemon's log tail.
func Start(ctx context.Context, o Options) (*Daemon, error) {
	o = o.withDefaults()
	d := &Daemon{opts: o}
	if v, err := d.version(ctx); err == nil {
		d.Version = v
		return d, nil
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("no libvirtd answers on %s and only root can start the system daemon (hint: run the test as root, or start libvirtd with `sudo systemctl start libvirtd` and join the libvirt group)", URI)
	}
	if err := os.MkdirAll(o.LogDir, 0o700); err != nil {
		return nil, fmt.Errorf("making the libvirtd fixture's log directory: %w", err)
	}
	// What a previous daemon left running is not ours to tear down.
	d.networks = d.live("network")
	d.domains = d.live("qemu")
	for _, p := range []struct{ name, path string }{{Virtlogd, o.Virtlogd}, {Libvirtd, o.Libvirtd}} {
		if err := d.spawn(p.name, p.path); err != nil {
			return nil, errors.Join(err, d.Stop(context.WithoutCancel(ctx)))
		}
	}
	v, err := d.wait(ctx)
	if err != nil {
		return nil, errors.Join(err, d.Stop(context.WithoutCancel(ctx)))
	}
	d.Version, d.Started = v, true
	return d, nil
}

func (o Options) withDefaults() Options {
	if o.Run == nil {
		o.Run = execx.OS{}
	}
	if o.Virsh == "" {
		o.Virsh = Virsh
	}
	if o.Libvirtd == "" {
		o.Libvirtd = Libvirtd
	}
	if o.Virtlogd == "" {
		o.Virtlogd = Virtlogd
	}
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	if o.LogDir == "" {
		o.LogDir = filepath.Join(os.TempDir(), "agent-vm-libvirtd")
	}
	return o
}

// spawn starts one daemon in the foreground of its own session (no --daemon:
// its pid is then the one Stop signals), logging to LogDir.
func (d *Daemon) spawn(name, path string) error {
	log := filepath.Join(d.opts.LogDir, name+".log")
	p, err := d.opts.Run.Start(execx.Detached{Path: path, StdoutPath: log})
	if err != nil {
		return fmt.Errorf("starting %s for the libvirtd fixture: %w (hint: `sudo agent-vm setup --tests` installs it)", name, err)
	}
	d.procs = append(d.procs, started{name: name, log: log, proc: p})
	return nil
}

// wait polls `virsh version` with backoff until libvirtd answers, a daemon
// exits, or the timeout.
func (d *Daemon) wait(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.Timeout)
	defer cancel()
	delay := 50 * time.Millisecond
	var last error
	for {
		v, err := d.version(ctx)
		if err == nil {
			return v, nil
		}
		last = err
		if err := d.exited(); err != nil {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("libvirtd did not answer on %s within %s: %v; libvirtd's log %s ends: %s", URI, d.opts.Timeout, last, d.log(Libvirtd), tail(d.log(Libvirtd)))
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// exited reports every daemon that has exited, with its log tail.
func (d *Daemon) exited() error {
	var errs []error
	for _, p := range d.procs {
		select {
		case <-p.proc.Exited():
			errs = append(errs, fmt.Errorf("%s exited (code %d) before libvirtd answered on %s; %s ends: %s (hint: is another libvirtd running outside this fixture's view, holding /run/libvirtd.pid?)",
				p.name, p.proc.ExitCode(), URI, p.log, tail(p.log)))
		default:
		}
	}
	return errors.Join(errs...)
}

// version asks libvirtd for its version.
func (d *Daemon) version(ctx context.Context) (string, error) {
	res, err := d.opts.Run.Run(ctx, execx.Cmd{Path: d.opts.Virsh, Args: []string{"-c", URI, "version"}})
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(res.Stdout)), nil
}

// Virsh runs virsh against the daemon and returns its trimmed stdout.
func (d *Daemon) Virsh(ctx context.Context, args ...string) (string, error) {
	res, err := d.opts.Run.Run(ctx, execx.Cmd{Path: d.opts.Virsh, Args: append([]string{"-c", URI}, args...)})
	return strings.TrimSpace(string(res.Stdout)), err
}

// live lists the networks ("network") or domains ("qemu") a libvirtd has
// running, from their status files under /run/libvirt: readable with no
// daemon up.
func (d *Daemon) live(kind string) []string {
	files, _ := filepath.Glob(filepath.Join(d.opts.Root, "/run/libvirt", kind, "*.xml"))
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".xml"))
	}
	return names
}

func (d *Daemon) log(name string) string {
	for _, p := range d.procs {
		if p.name == name {
			return p.log
		}
	}
	return filepath.Join(d.opts.LogDir, name+".log")
}

// Logs names the log files of the daemons the fixture started, for a
// failing test to print.
func (d *Daemon) Logs() []string {
	var out []string
	for _, p := range d.procs {
		out = append(out, p.log)
	}
	return out
}

// Stop tears down what the fixture started: the domains and networks its
// libvirtd runs (not those a previous daemon left), then libvirtd and
// virtlogd, each by pid, SIGTERM then SIGKILL after a grace. A daemon it did
// not start is left alone.
func (d *Daemon) Stop(ctx context.Context) error {
	if len(d.procs) == 0 {
		return nil
	}
	var errs []error
	if d.running(Libvirtd) {
		errs = append(errs, d.teardown(ctx)...)
	}
	for i := len(d.procs) - 1; i >= 0; i-- {
		if err := stopProcess(ctx, d.procs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	d.procs = nil
	return errors.Join(errs...)
}

func (d *Daemon) running(name string) bool {
	for _, p := range d.procs {
		if p.name == name {
			select {
			case <-p.proc.Exited():
				return false
			default:
				return true
			}
		}
	}
	return false
}

// teardown destroys the domains and networks that became live while our
// daemon ran: left running, they outlive libvirtd (QEMU, dnsmasq, a bridge).
func (d *Daemon) teardown(ctx context.Context) []error {
	var errs []error
	for _, kind := range []struct{ dir, verb string }{{"qemu", "destroy"}, {"network", "net-destroy"}} {
		before := d.domains
		if kind.dir == "network" {
			before = d.networks
		}
		for _, name := range d.live(kind.dir) {
			if slices.Contains(before, name) {
				continue
			}
			if _, err := d.Virsh(ctx, kind.verb, name); err != nil {
				errs = append(errs, fmt.Errorf("libvirtd fixture: %s %s: %w", kind.verb, name, err))
			}
		}
	}
	return errs
}

// stopProcess sends SIGTERM, waits up to 10 s, then SIGKILL.
func stopProcess(ctx context.Context, p started) error {
	select {
	case <-p.proc.Exited():
		return nil
	default:
	}
	if err := syscall.Kill(p.proc.Pid(), syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stopping %s (pid %d): %w", p.name, p.proc.Pid(), err)
	}
	select {
	case <-p.proc.Exited():
		return nil
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	if err := syscall.Kill(p.proc.Pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing %s (pid %d): %w", p.name, p.proc.Pid(), err)
	}
	<-p.proc.Exited()
	return nil
}

// tail returns the last lines of a log file, for errors.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) == 0 {
		return "(empty log)"
	}
	return execx.TailLines(string(b), 5)
}
