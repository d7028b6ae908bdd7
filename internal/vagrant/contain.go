package vagrant

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/libvirtnet"
	"github.com/agent-vm/agent-vm/internal/proc"
)

// Files of the contained network: the marker that a start made one (its
// teardown does nothing without it), the egress proxy's ports file
// (egress.Front) and its output.
const (
	ContainedMark = "contained"
	FrontPorts    = "egress-front.json"
	EgressLog     = "egress.log"
)

// ContainsNetwork makes the driver a driver.NetworkContainer: a start
// with a Machine.Network runs the guest on an isolated libvirt network of
// its own, fenced by nftables, with the egress proxy's TCP front as its
// only way out (internal/libvirtnet; the package doc's "Network").
func (d *Driver) ContainsNetwork() {}

var _ driver.NetworkContainer = (*Driver)(nil)

func (d *Driver) libvirt() libvirtnet.Libvirt { return libvirtnet.Libvirt{Run: d.Run, URI: d.uri()} }

func (d *Driver) euid() int {
	if d.Euid == nil {
		return os.Geteuid()
	}
	return d.Euid()
}

// errNeedsRoot is a contained start refused to another user than root.
var errNeedsRoot = errors.New("the vagrant backend contains a VM's network with a libvirt network and an nftables table of the VM's own, which only root can make (hint: run agent-vm as root, e.g. with sudo; the qemu backend contains the network without root)")

// contain makes m's contained network before its `vagrant up`: the
// libvirt network, the egress proxy on the bridge's address, and the
// fence that leads the guest's doors there. mac is the guest NIC's. On
// failure nothing of it is left.
func (d *Driver) contain(ctx context.Context, m driver.Machine, mac string) (libvirtnet.Net, error) {
	n := m.Network
	if d.euid() != 0 {
		return libvirtnet.Net{}, fmt.Errorf("starting %s: %w", m.Name, errNeedsRoot)
	}
	doors, err := netip.ParseAddr(n.Addr)
	if err != nil || len(n.Proxy) == 0 || n.ProxyPort == 0 || m.UUID == "" {
		return libvirtnet.Net{}, fmt.Errorf("internal error: incomplete network (addr %q, proxy port %d, proxy %q, uuid %q)", n.Addr, n.ProxyPort, n.Proxy, m.UUID)
	}
	if err := touch(runFile(m, ContainedMark)); err != nil {
		return libvirtnet.Net{}, err
	}
	name, id := MachineName(m), libvirtnet.ID(m.UUID)
	net, err := d.libvirt().Up(ctx, name, func(i int) libvirtnet.Net { return libvirtnet.Candidate(name, id, mac, doors, i) })
	if err != nil {
		d.uncontain(m)
		return libvirtnet.Net{}, fmt.Errorf("starting %s: %w", m.Name, err)
	}
	fp, err := d.startProxy(ctx, m, net.Host)
	if err == nil {
		var rs string
		rs, err = net.Ruleset(id, libvirtnet.Front{ProxyPort: n.ProxyPort, Proxy: fp.Proxy, Doors: fp.Doors})
		if err == nil {
			err = d.libvirt().Fence(ctx, rs)
		}
	}
	if err != nil {
		d.uncontain(m)
		return libvirtnet.Net{}, fmt.Errorf("starting %s: %w", m.Name, err)
	}
	return net, nil
}

// isProxyFor matches the egress proxy of m (the one argument that names
// the VM: its ports file).
func isProxyFor(m driver.Machine) proc.Match {
	ports := runFile(m, FrontPorts)
	return func(args []string) bool {
		i := slices.Index(args, "--front-ports")
		return i >= 0 && i+1 < len(args) && args[i+1] == ports
	}
}

// startProxy starts m's egress proxy with its TCP front on host (the
// bridge's address), one door listener per exposed port, and waits for its
// ports file. One a crashed run left is ended first. As root it drops to
// the workspace's owner once it listens (as the QEMU driver's does).
func (d *Driver) startProxy(ctx context.Context, m driver.Machine, host netip.Addr) (egress.FrontPorts, error) {
	n := m.Network
	match := isProxyFor(m)
	if old := proc.Find(match); old != 0 {
		proc.Kill(old, match)
	}
	ports := runFile(m, FrontPorts)
	_ = os.Remove(ports)
	argv := append(slices.Clone(n.Proxy), "--front", host.String(), "--front-ports", ports)
	for _, p := range n.Exposed {
		argv = append(argv, "--front-door", strconv.Itoa(p))
	}
	if d.euid() == 0 && m.Share.UID > 0 {
		if err := egress.GiveDir(n.Dir, m.Share.UID, m.Share.GID); err != nil {
			return egress.FrontPorts{}, fmt.Errorf("giving the network directory to the workspace's owner: %w", err)
		}
		argv = append(argv, "--run-as", strconv.Itoa(m.Share.UID)+":"+strconv.Itoa(m.Share.GID))
	}
	log := filepath.Join(m.LogsDir, EgressLog)
	p, err := d.Run.Start(execx.Detached{Path: argv[0], Args: argv[1:], StdoutPath: log, Stdin: n.ProxyInput})
	if err != nil {
		return egress.FrontPorts{}, fmt.Errorf("starting the egress proxy: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fp, err := egress.ReadFrontPorts(ports); err == nil {
			return fp, nil
		}
		select {
		case <-p.Exited():
			return egress.FrontPorts{}, fmt.Errorf("the egress proxy exited at once (code %d): %s", p.ExitCode(), driver.TailFile(log, 3))
		case <-ctx.Done():
			proc.Kill(p.Pid(), match)
			return egress.FrontPorts{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			proc.Kill(p.Pid(), match)
			return egress.FrontPorts{}, fmt.Errorf("the egress proxy did not listen within 10s: %s", driver.TailFile(log, 3))
		}
	}
}

// uncontain ends what contain made for m, if a start made any: the proxy,
// the fence and the libvirt network (best effort, logged: it runs after a
// stop, a destroy or a failed start, which must not fail for it; the next
// start and destroy try again while the marker stays).
func (d *Driver) uncontain(m driver.Machine) {
	if !exists(runFile(m, ContainedMark)) {
		return
	}
	match := isProxyFor(m)
	for _, pid := range proc.FindAll(match) {
		proc.Kill(pid, match)
	}
	_ = os.Remove(runFile(m, FrontPorts))
	if m.UUID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.libvirt().Down(ctx, MachineName(m), libvirtnet.TableName(libvirtnet.ID(m.UUID))); err != nil {
		d.Log.Warn("could not remove the VM's contained network", "vm", m.Name, "error", err)
		return
	}
	removeMarkers(m, ContainedMark)
}
