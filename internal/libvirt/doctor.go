package libvirt

import (
	"context"
	"fmt"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/libvirtnet"
	"github.com/agent-vm/agent-vm/internal/qemuuser"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// Doctor checks what a start needs on this host: libvirtd answering on
// qemu:///system, root and nft for the VM's network and fence, QEMU's C
// virtiofsd for the jailed share, and libvirt's QEMU user to hand files
// to.
func (d *Driver) Doctor(ctx context.Context) ([]driver.Check, bool) {
	checks := []driver.Check{d.libvirtCheck(), libvirtnet.DoctorCheck(d.Run, d.euid(), "libvirt"), d.shareCheck(ctx), d.userCheck()}
	ok := true
	for _, c := range checks {
		ok = ok && c.OK
	}
	return checks, ok
}

func (d *Driver) libvirtCheck() driver.Check {
	c := driver.Check{Name: "libvirt API (" + string(golibvirt.QEMUSystem) + ")"}
	h, done, err := d.connect()
	if err != nil {
		c.Detail = err.Error()
		c.Hint = "start it: `sudo systemctl start libvirtd` (without systemd: `sudo libvirtd -d` and `sudo virtlogd -d`); `sudo agent-vm setup --backend libvirt` installs it"
		return c
	}
	defer done()
	v, err := h.L.ConnectGetLibVersion()
	if err != nil {
		c.Detail = "libvirtd answers, but not its version: " + err.Error()
		return c
	}
	c.OK, c.Detail = true, fmt.Sprintf("libvirt %d.%d.%d", v/1000000, v/1000%1000, v%1000)
	return c
}

func (d *Driver) shareCheck(ctx context.Context) driver.Check {
	c := driver.Check{Name: "libvirt workspace share", Hint: hostpkgs.InstallHint("virtiofsd")}
	v, err := virtiofsd.Find(ctx, d.Run)
	switch {
	case err != nil:
		c.Detail = err.Error()
	case v.Rust:
		c.Detail = v.Path + " is the Rust virtiofsd; agent-vm jails only QEMU's C one (Debian 12's qemu-system-common)"
	default:
		c.OK, c.Hint, c.Detail = true, "", v.Path+", jailed as the workspace's owner"
	}
	return c
}

func (d *Driver) userCheck() driver.Check {
	c := driver.Check{Name: "libvirt's QEMU user"}
	if _, ok := qemuuser.Lookup(d.qemuUser()); !ok {
		c.Detail, c.Hint = "no user "+d.qemuUser()+" to hand the VM's files to", "`sudo agent-vm setup --backend libvirt` installs libvirt-daemon-system, which adds it"
		return c
	}
	c.OK, c.Detail = true, d.qemuUser()
	return c
}
