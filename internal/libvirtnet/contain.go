package libvirtnet

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/proc"
)

// Files of the contained network: the marker in the run directory that a
// start made one (Uncontain does nothing without it), the egress proxy's
// ports file in the run directory (egress.Front) and its output in the
// logs directory.
const (
	ContainedMark = "contained"
	FrontPorts    = "egress-front.json"
	EgressLog     = "egress.log"
)

// Containment makes and removes the contained networks of the machines a
// driver runs through libvirt: the machine's libvirt network, its egress
// proxy and the fence between them.
type Containment struct {
	Libvirt Libvirt
	// Run is where the egress proxy runs (this machine).
	Run execx.Runner
	// Log receives Uncontain's warnings.
	Log hclog.Logger
	// Euid is the user agent-vm runs as; nil = os.Geteuid.
	Euid func() int
}

func (c Containment) euid() int {
	if c.Euid == nil {
		return os.Geteuid()
	}
	return c.Euid()
}

// Contain makes m's contained network before its machine starts: the libvirt
// network name (the machine's), the egress proxy on its bridge's address, and the
// fence that leads the guest's connections to the proxy address there. mac is the
// guest NIC's. On failure nothing of it is left. Making a bridge and a table
// needs root: the driver refuses another user first, in its own words.
func (c Containment) Contain(ctx context.Context, m driver.Machine, name, mac string) (Net, error) {
	n := m.Network
	proxyAddr, err := netip.ParseAddr(n.Addr)
	if err != nil || len(n.Proxy) == 0 || n.ProxyPort == 0 || m.UUID == "" {
		return Net{}, fmt.Errorf("internal error: incomplete network (addr %q, proxy port %d, proxy %q, uuid %q)", n.Addr, n.ProxyPort, n.Proxy, m.UUID)
	}
	if err := atomicfile.Write(filepath.Join(m.RunDir, ContainedMark), nil, 0o600); err != nil {
		return Net{}, err
	}
	id := ID(m.UUID)
	net, err := c.Libvirt.Up(ctx, name, func(i int) Net { return Candidate(name, id, mac, proxyAddr, i) })
	if err != nil {
		c.Uncontain(m, name)
		return Net{}, err
	}
	fp, err := c.startProxy(ctx, m, net.Host)
	if err == nil {
		var rs string
		rs, err = net.Ruleset(id, Front{ProxyPort: n.ProxyPort, Proxy: fp.Proxy, Exposed: fp.Exposed})
		if err == nil {
			err = c.Libvirt.Fence(ctx, rs)
		}
	}
	if err != nil {
		c.Uncontain(m, name)
		return Net{}, err
	}
	return net, nil
}

// isProxyFor matches the egress proxy of m (the one argument that names
// the VM: its ports file).
func isProxyFor(m driver.Machine) proc.Match {
	ports := filepath.Join(m.RunDir, FrontPorts)
	return func(args []string) bool {
		i := slices.Index(args, "--front-ports")
		return i >= 0 && i+1 < len(args) && args[i+1] == ports
	}
}

// startProxy starts m's egress proxy with its TCP front on host (the
// bridge's address), one listener per exposed port, and waits for its
// ports file. One a crashed run left is ended first. As root it drops to
// the workspace's owner once it listens (as the QEMU driver's does).
func (c Containment) startProxy(ctx context.Context, m driver.Machine, host netip.Addr) (egress.FrontPorts, error) {
	n := m.Network
	match := isProxyFor(m)
	if old := proc.Find(match); old != 0 {
		proc.Kill(old, match)
	}
	ports := filepath.Join(m.RunDir, FrontPorts)
	_ = os.Remove(ports)
	argv := append(slices.Clone(n.Proxy), "--front", host.String(), "--front-ports", ports)
	for _, p := range n.Exposed {
		argv = append(argv, "--front-exposed", strconv.Itoa(p))
	}
	if n.ExposedDir != "" {
		argv = append(argv, "--exposed-dir", n.ExposedDir)
	}
	if c.euid() == 0 && m.Share.UID > 0 {
		if err := egress.GiveDir(n.Dir, m.Share.UID, m.Share.GID); err != nil {
			return egress.FrontPorts{}, fmt.Errorf("giving the network directory to the workspace's owner: %w", err)
		}
		argv = append(argv, "--run-as", strconv.Itoa(m.Share.UID)+":"+strconv.Itoa(m.Share.GID))
	}
	log := filepath.Join(m.LogsDir, EgressLog)
	p, err := c.Run.Start(execx.Detached{Path: argv[0], Args: argv[1:], StdoutPath: log, Stdin: n.ProxyInput})
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

// Uncontain ends what Contain made for m, if a start made any: the proxy,
// the fence and the libvirt network name (best effort, logged: it runs
// after a stop, a destroy or a failed start, which must not fail for it;
// the next start and destroy try again while the marker stays).
func (c Containment) Uncontain(m driver.Machine, name string) {
	mark := filepath.Join(m.RunDir, ContainedMark)
	if _, err := os.Stat(mark); err != nil {
		return
	}
	match := isProxyFor(m)
	for _, pid := range proc.FindAll(match) {
		proc.Kill(pid, match)
	}
	_ = os.Remove(filepath.Join(m.RunDir, FrontPorts))
	if m.UUID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Libvirt.Down(ctx, name, TableName(ID(m.UUID))); err != nil {
		c.Log.Warn("could not remove the VM's contained network", "vm", m.Name, "error", err)
		return
	}
	_ = os.Remove(mark)
}

// DoctorCheck is doctor's line for containing networks this way for the
// backend called backend: root (for the bridge and the table) and nft.
func DoctorCheck(run execx.Runner, euid int, backend string) driver.Check {
	c := driver.Check{Name: backend + " containment", Hint: "run agent-vm as root (sudo); `sudo agent-vm setup --backend " + backend + "` installs nft (Debian package nftables)"}
	_, err := run.LookPath(NFT)
	switch {
	case euid != 0:
		c.Detail = "each VM's network and its nftables fence can only be made as root: agent-vm as this user cannot start a " + backend + " VM"
	case err != nil:
		c.Detail = "nft is not installed: the VMs' nftables fences cannot be made"
	default:
		c.OK, c.Hint = true, ""
		c.Detail = "each VM on a libvirt network of its own, fenced by nftables, behind its egress proxy"
	}
	return c
}
