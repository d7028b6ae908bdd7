package libvirt

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/libvirtnet"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/tcpfwd"
)

// A VM's guest has an address of its own on its network, which the host
// reaches; its forwards are `agent-vm __net-forward` processes, one per
// host port, listening on 127.0.0.1 only, dropping to the workspace's
// owner once listening and ending with the VM's QEMU. One process per port
// lets `port add` and `port rm` start and end one forward without
// touching the others (the held SSH connection rides the SSH forward).

// isForwarderFor matches m's __net-forward of host port (any, for 0): its
// --tag is m's run directory, its --forward starts with the port.
func isForwarderFor(m driver.Machine, port int) proc.Match {
	return func(args []string) bool {
		// (net-forward: the name an older agent-vm started it by.)
		if !slices.Contains(args, "__net-forward") && !slices.Contains(args, "net-forward") {
			return false
		}
		if i := slices.Index(args, "--tag"); i < 0 || i+1 >= len(args) || args[i+1] != m.RunDir {
			return false
		}
		i := slices.Index(args, "--forward")
		return port == 0 || (i >= 0 && i+1 < len(args) && strings.HasPrefix(args[i+1], strconv.Itoa(port)+"="))
	}
}

// startForward starts the forward f of m to guest and returns once its
// process listens (it says so: a probe of the port would take another
// program's listener there for it), or with the forwarder's complaint; a
// port another program took since the start's check is ports.ErrTaken.
func (d *Driver) startForward(ctx context.Context, m driver.Machine, guest netip.Addr, f driver.Forward) error {
	exe, err := d.executable()
	if err != nil {
		return err
	}
	args := []string{"__net-forward", "--tag", m.RunDir,
		"--forward", strconv.Itoa(f.Host) + "=" + netip.AddrPortFrom(guest, uint16(f.Guest)).String()}
	if r := m.Remote; r != nil {
		// The guest is on the host's network: reached through the link
		// (the host's sshd connects), and the forward ends with stop.
		args = append(args, "--via-addr", r.Addr, "--via-user", r.User, "--via-key", r.KeyFile, "--via-known-hosts", r.KnownHosts)
	} else {
		args = append(args, "--pidfile", qemuPidFile(m))
	}
	if m.Share.UID > 0 {
		args = append(args, "--run-as", strconv.Itoa(m.Share.UID)+":"+strconv.Itoa(m.Share.GID))
	}
	log := filepath.Join(m.LogsDir, "forward-"+strconv.Itoa(f.Host)+".log")
	p, err := d.Run.Start(execx.Detached{Path: exe, Args: args, StdoutPath: log})
	if err != nil {
		return fmt.Errorf("starting the %s forward: %w", f.Name, err)
	}
	match := isForwarderFor(m, f.Host)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(log); strings.Contains(string(b), tcpfwd.ListeningLine(f.Host)) {
			return nil
		}
		select {
		case <-p.Exited():
			said := driver.TailFile(log, 3)
			if strings.Contains(said, syscall.EADDRINUSE.Error()) {
				return fmt.Errorf("port %d (%s) is in use on 127.0.0.1 by another program, which took it after the start's check (hint: start the VM again, which moves a port agent-vm picked; a port you chose is yours to free: `ss -ltnp 'sport = :%d'` shows the program): %w", f.Host, f.Name, f.Host, ports.ErrTaken)
			}
			return fmt.Errorf("the %s forward (127.0.0.1:%d) ended at once (code %d): %s", f.Name, f.Host, p.ExitCode(), said)
		case <-ctx.Done():
			proc.Kill(p.Pid(), match)
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			proc.Kill(p.Pid(), match)
			return fmt.Errorf("the %s forward did not listen on 127.0.0.1:%d within 10s: %s", f.Name, f.Host, driver.TailFile(log, 3))
		}
	}
}

// startExposedSockets starts the __net-forward that makes, on m's host, the socket
// of each port m exposes in exposedDir (given to the workspace's owner, the
// proxy's user there) and carries its connections back to this machine's
// 127.0.0.1, and returns once every socket is made.
func (d *Driver) startExposedSockets(m driver.Machine, exposedDir string) error {
	exe, err := d.executable()
	if err != nil {
		return err
	}
	r := m.Remote
	args := []string{"__net-forward", "--tag", m.RunDir,
		"--via-addr", r.Addr, "--via-user", r.User, "--via-key", r.KeyFile, "--via-known-hosts", r.KnownHosts}
	var want []string
	for _, p := range m.Network.Exposed {
		sock := path.Join(exposedDir, strconv.Itoa(p))
		args = append(args, "--return-socket", sock+"="+strconv.Itoa(p))
		want = append(want, hostlink.SocketReadyLine(sock))
	}
	if m.Share.UID > 0 {
		owner := strconv.Itoa(m.Share.UID) + ":" + strconv.Itoa(m.Share.GID)
		args = append(args, "--return-socket-owner", owner, "--run-as", owner)
	}
	log := filepath.Join(m.LogsDir, "exposed.log")
	_ = os.Remove(log)
	p, err := d.Run.Start(execx.Detached{Path: exe, Args: args, StdoutPath: log})
	if err != nil {
		return fmt.Errorf("starting the exposed ports' forwarded sockets: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(log)
		missing := slices.DeleteFunc(slices.Clone(want), func(l string) bool { return strings.Contains(string(b), l) })
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("the exposed ports' forwarded sockets ended at once (code %d): %s", p.ExitCode(), driver.TailFile(log, 3))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			proc.Kill(p.Pid(), isForwarderFor(m, 0))
			return fmt.Errorf("the exposed ports' forwarded sockets were not made on host %s within 30s: %s", r.Host, driver.TailFile(log, 3))
		}
	}
}

// stopForwards ends m's forward of host port (every one, for 0).
func (d *Driver) stopForwards(m driver.Machine, port int) {
	match := isForwarderFor(m, port)
	for _, pid := range proc.FindAll(match) {
		proc.Kill(pid, match)
	}
}

func (d *Driver) portFree(port int) bool {
	if d.PortFree != nil {
		return d.PortFree(port)
	}
	return ports.Listenable(port)
}

// checkPortsFree fails when another program holds a port m forwards.
func (d *Driver) checkPortsFree(m driver.Machine) error {
	for _, f := range m.Forwards {
		if err := ports.CheckForward(f.Host, f.Name, d.portFree, 3*time.Second); err != nil {
			return fmt.Errorf("starting %s: %w", m.Name, err)
		}
	}
	return nil
}

// AddForward implements driver.Forwarder: a forward of its own for f on
// the running machine.
func (d *Driver) AddForward(ctx context.Context, m driver.Machine, f driver.Forward) error {
	lv, n, err := d.liveNet(ctx, m)
	if err != nil {
		return fmt.Errorf("forwarding port %d to %s: %w", f.Host, m.Name, err)
	}
	if !lv.Alive() {
		return fmt.Errorf("forwarding port %d to %s: %w", f.Host, m.Name, driver.ErrNotRunning)
	}
	if !n.Guest.IsValid() {
		return fmt.Errorf("forwarding port %d to %s: its start did not record the guest's address (hint: restart the VM)", f.Host, m.Name)
	}
	if err := ports.CheckForward(f.Host, f.Name, d.portFree, 3*time.Second); err != nil {
		return err
	}
	return d.startForward(ctx, m, n.Guest, f)
}

// liveNet is m's live state and its network as its start recorded it
// (the zero Net when it did not).
func (d *Driver) liveNet(ctx context.Context, m driver.Machine) (driver.Live, libvirtnet.Net, error) {
	if m.Remote != nil {
		lv, res, err := d.inspectRemote(ctx, m)
		if err != nil || res.Net == nil {
			return lv, libvirtnet.Net{}, err
		}
		return lv, *res.Net, nil
	}
	lv, err := d.Inspect(ctx, m)
	if err != nil {
		return lv, libvirtnet.Net{}, err
	}
	n, _ := readNet(m)
	return lv, n, nil
}

// RemoveForward implements driver.Forwarder: it returns once the host
// port no longer listens, so that `port rm` is done when it says so.
func (d *Driver) RemoveForward(ctx context.Context, m driver.Machine, f driver.Forward) error {
	d.stopForwards(m, f.Host)
	deadline := time.Now().Add(forwardGone)
	for !d.portFree(f.Host) {
		if time.Now().After(deadline) {
			return fmt.Errorf("127.0.0.1:%d still listens %s after its forward was stopped: its forwarder did not end, or another program took the port (hint: `ss -ltnp 'sport = :%d'` names it)", f.Host, forwardGone, f.Host)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// forwardGone bounds the wait for a stopped forward's port to close.
const forwardGone = 5 * time.Second
