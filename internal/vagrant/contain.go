package vagrant

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/libvirtnet"
)

// ContainsNetwork makes the driver a driver.NetworkContainer: a start
// with a Machine.Network runs the guest on an isolated libvirt network of
// its own, fenced by nftables, with the egress proxy's TCP front as its
// only way out (internal/libvirtnet; the package doc's "Network").
func (d *Driver) ContainsNetwork() {}

var (
	_ driver.NetworkContainer = (*Driver)(nil)
	_ driver.ForeignReacher   = (*Driver)(nil)
)

func (d *Driver) libvirt() libvirtnet.Libvirt { return libvirtnet.Libvirt{Run: d.Run, URI: d.uri()} }

func (d *Driver) containment() libvirtnet.Containment {
	return libvirtnet.Containment{Libvirt: d.libvirt(), Run: d.Run, Log: d.Log, Euid: d.Euid}
}

func (d *Driver) euid() int {
	if d.Euid == nil {
		return os.Geteuid()
	}
	return d.Euid()
}

// errNeedsRoot is a contained start refused to another user than root.
var errNeedsRoot = errors.New("the vagrant backend contains a VM's network with a libvirt network and an nftables table of the VM's own, which only root can make (hint: run agent-vm as root, e.g. with sudo; the qemu backend contains the network without root)")

// contain makes m's contained network before its `vagrant up`, on a
// libvirt network named after the machine (libvirtnet.Containment.Contain:
// the network, the egress proxy on the bridge's address, the fence). mac
// is the guest NIC's. On failure nothing of it is left.
func (d *Driver) contain(ctx context.Context, m driver.Machine, mac string) (libvirtnet.Net, error) {
	if d.euid() != 0 {
		return libvirtnet.Net{}, fmt.Errorf("starting %s: %w", m.Name, errNeedsRoot)
	}
	net, err := d.containment().Contain(ctx, m, MachineName(m), mac)
	if err != nil {
		return libvirtnet.Net{}, fmt.Errorf("starting %s: %w", m.Name, err)
	}
	return net, nil
}

// uncontain ends what contain made for m, if a start made any (best
// effort, logged).
func (d *Driver) uncontain(m driver.Machine) { d.containment().Uncontain(m, MachineName(m)) }
