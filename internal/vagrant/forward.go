package vagrant

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/ports"
)

// vagrant-libvirt forwards a port by spawning `ssh -L
// 127.0.0.1:HOST:GUEST_IP:GUEST_PORT -N GUEST_IP` with
// ExitOnForwardFailure=yes once the guest answers, writes its pid to
// <machine data>/pids/ssh_HOST.pid and its output to
// <machine data>/logs/ssh-forwarding-127.0.0.1_HOST-GUEST_IP_GUEST_PORT.log,
// and does not wait for it: `vagrant up` succeeds whether or not the
// forwarder could bind the host port. When another program holds the port,
// the forwarder exits, and agent-vm's SSH would reach that program (another
// VM's forward, say) instead of this VM. So the driver checks the ports are
// free before `vagrant up` and, after it, waits until the forwarder vagrant
// started is the process listening on each port (VerifyForwards).

// ForwardTimeout bounds the wait for vagrant's forwarders to listen after
// `vagrant up` or `vagrant resume` returned: each logs in to the guest over
// SSH first, seconds on a loaded host.
const ForwardTimeout = 2 * time.Minute

// machineData is vagrant-libvirt's data directory of m's machine.
func machineData(m driver.Machine) string {
	return filepath.Join(Project(m.RunDir), DotDir, "machines", MachineName(m), "libvirt")
}

func forwarderPidFile(m driver.Machine, port int) string {
	return filepath.Join(machineData(m), "pids", "ssh_"+strconv.Itoa(port)+".pid")
}

// forwarderLog is the log of the forwarder of host port, "" when there is
// none.
func forwarderLog(m driver.Machine, port int) string {
	logs, _ := filepath.Glob(filepath.Join(machineData(m), "logs", "ssh-forwarding-127.0.0.1_"+strconv.Itoa(port)+"-*.log"))
	if len(logs) == 0 {
		return ""
	}
	return logs[0]
}

// checkPortsFree fails when a port m forwards is held by another program
// before vagrant up; a forwarder of m's own left by a run before (vagrant
// up does not end them after a crash) is ended first.
func (d *Driver) checkPortsFree(m driver.Machine) error {
	d.endForwarders(m)
	probe := d.PortFree
	if probe == nil {
		probe = ports.Listenable
	}
	for _, f := range m.Forwards {
		if err := ports.CheckForward(f.Host, f.Name, probe, 3*time.Second); err != nil {
			return fmt.Errorf("starting %s: %w", m.Name, err)
		}
	}
	return nil
}

// endForwarders ends the forwarders vagrant-libvirt recorded for m that
// still run, as vagrant halt does: only a process that is an ssh forwarding
// that very host port is signalled (a recorded pid may have been reused).
func (d *Driver) endForwarders(m driver.Machine) {
	files, _ := filepath.Glob(filepath.Join(machineData(m), "pids", "ssh_*.pid"))
	for _, f := range files {
		port, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "ssh_"), ".pid"))
		if err != nil {
			continue
		}
		if pid, ok := forwarderPid(f); ok && isForwarder(pid, port) {
			d.Log.Info("ending a port forward a run before left", "vm", m.Name, "port", port, "pid", pid)
			_ = syscall.Kill(pid, syscall.SIGTERM)
			for deadline := time.Now().Add(3 * time.Second); alive(pid) && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond)
			}
		}
		_ = os.Remove(f)
	}
}

func forwarderPid(file string) (int, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

// alive tells whether pid is a process that has not exited (a zombie has
// no command line).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && len(b) > 0
}

// isForwarder tells whether pid runs ssh with a -L forward of host port.
func isForwarder(pid, port int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) == 0 || filepath.Base(args[0]) != "ssh" {
		return false
	}
	for i, a := range args[:len(args)-1] {
		if a == "-L" && strings.HasPrefix(args[i+1], "127.0.0.1:"+strconv.Itoa(port)+":") {
			return true
		}
	}
	return false
}

// VerifyForwards waits until every port m forwards is listened on by the
// forwarder vagrant started for it, and fails, saying so and what to do,
// when another program holds a port or a forwarder ended or never bound.
// next is what to run once the port is free, said in the hint.
func (d *Driver) VerifyForwards(ctx context.Context, m driver.Machine, next string) error {
	ctx, cancel := context.WithTimeout(ctx, ForwardTimeout)
	defer cancel()
	for _, f := range m.Forwards {
		if err := d.verifyForward(ctx, m, f, next); err != nil {
			return err
		}
	}
	return nil
}

func (d *Driver) verifyForward(ctx context.Context, m driver.Machine, f driver.Forward, next string) error {
	delay := 100 * time.Millisecond
	for {
		err := forwardBound(m, f.Host)
		if err == nil {
			return nil
		}
		var e *forwardError
		if !errors.As(err, &e) || !e.pending {
			return d.describeForward(m, f, next, err)
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return d.describeForward(m, f, next, fmt.Errorf("it did not listen within %s: %w", ForwardTimeout, err))
			}
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// forwardError is why a forward is not (yet) bound; pending is "wait".
type forwardError struct {
	msg     string
	pending bool
	taken   bool // another program listens on the port
}

func (e *forwardError) Error() string { return e.msg }

// forwardBound is nil when the forwarder recorded for host port listens on
// it.
func forwardBound(m driver.Machine, port int) error {
	pid, ok := forwarderPid(forwarderPidFile(m, port))
	if !ok {
		return &forwardError{msg: "vagrant recorded no forwarder for it (" + forwarderPidFile(m, port) + ")"}
	}
	inodes, err := listeningInodes(port)
	if err != nil {
		return err
	}
	if !isForwarder(pid, port) {
		if alive(pid) {
			// Not ssh (yet): a process between fork and exec.
			return &forwardError{msg: fmt.Sprintf("process %d, recorded as vagrant's forwarder, is not an ssh forwarding the port", pid), pending: true}
		}
		e := &forwardError{msg: fmt.Sprintf("vagrant's forwarder (ssh, pid %d) exited", pid)}
		if len(inodes) > 0 {
			e.taken = true
			e.msg += ", and another program listens on the port"
		}
		return e
	}
	if len(inodes) == 0 {
		return &forwardError{msg: fmt.Sprintf("vagrant's forwarder (ssh, pid %d) is not listening yet", pid), pending: true}
	}
	if holdsSocket(pid, inodes) {
		return nil
	}
	// Another program listens; the forwarder exits once it fails to bind.
	return &forwardError{msg: fmt.Sprintf("another program listens on the port, not vagrant's forwarder (ssh, pid %d)", pid), pending: true, taken: true}
}

// describeForward turns why forward f of m is not bound into the error the
// user reads.
func (d *Driver) describeForward(m driver.Machine, f driver.Forward, next string, err error) error {
	log := forwarderLog(m, f.Host)
	said := ""
	if log != "" {
		said = strings.TrimSpace(driver.TailFile(log, 3))
	}
	var e *forwardError
	if (errors.As(err, &e) && e.taken) || strings.Contains(said, "Address already in use") {
		return fmt.Errorf("host port %d, the %s port of %s, is held by another program, so vagrant's forward of it (an `ssh -L` process) could not listen there and agent-vm would reach that program instead of the VM (hint: stop that program, which `ss -ltnp 'sport = :%d'` shows, then run %s): %w", f.Host, f.Name, short(m), f.Host, next, ports.ErrTaken)
	}
	if said != "" {
		err = fmt.Errorf("%w; its log %s says: %s", err, log, said)
	}
	return fmt.Errorf("vagrant's forward of host port %d (%s) to %s: %w (hint: vagrant's output is in %s; then run %s)", f.Host, f.Name, short(m), err, d.Logs(m).Driver, next)
}

// listeningInodes are the socket inodes listening on TCP port of
// 127.0.0.1 or of every IPv4 address, from /proc/net/tcp (this network
// namespace's).
func listeningInodes(port int) (map[string]bool, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return nil, fmt.Errorf("reading the host's listening sockets: %w", err)
	}
	defer f.Close()
	local := map[string]bool{fmt.Sprintf("0100007F:%04X", port): true, fmt.Sprintf("00000000:%04X", port): true}
	inodes := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fs := strings.Fields(sc.Text())
		if len(fs) > 9 && local[fs[1]] && fs[3] == "0A" {
			inodes[fs[9]] = true
		}
	}
	return inodes, sc.Err()
}

// holdsSocket tells whether one of pid's descriptors is one of inodes.
func holdsSocket(pid int, inodes map[string]bool) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	des, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, de := range des {
		l, err := os.Readlink(filepath.Join(dir, de.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
			return true
		}
	}
	return false
}
