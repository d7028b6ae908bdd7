package vagrant

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/libvirtnet"
)

// Plugin is the vagrant plugin of the libvirt provider.
const Plugin = "vagrant-libvirt"

// Doctor checks vagrant, its libvirt plugin and libvirt, the provider of
// agent-vm's Vagrantfile, and what containing a VM's network takes (root,
// nft); ok is whether all four are there. A last,
// informational line names the other providers this host has, which only a
// repository's own Vagrantfile may choose (see the package doc).
func (d *Driver) Doctor(ctx context.Context) ([]driver.Check, bool) {
	v := driver.CheckProgram(ctx, d.Run, "vagrant", []string{"--version"}, hostpkgs.InstallHint("vagrant"))
	checks := []driver.Check{v, d.pluginCheck(ctx, v.OK), d.libvirtCheck(ctx), libvirtnet.DoctorCheck(d.Run, d.euid(), "vagrant")}
	ok := true
	for _, c := range checks {
		ok = ok && c.OK
	}
	return append(checks, d.otherProviders()), ok
}

// otherProviders says which providers besides libvirt this host has
// (VirtualBox's VBoxManage; vagrant's docker and hyperv need more than a
// program to tell), for a repository's own Vagrantfile. It is never a
// failure: agent-vm's own Vagrantfile needs none of them.
func (d *Driver) otherProviders() driver.Check {
	c := driver.Check{Name: "other vagrant providers", OK: true}
	if p, err := d.Run.LookPath("VBoxManage"); err == nil {
		c.Detail = "virtualbox (" + p + "): only for a repository's own Vagrantfile that chooses it; agent-vm never tested it"
		return c
	}
	c.Detail = "none found (VirtualBox: no VBoxManage); agent-vm's own Vagrantfile needs only libvirt"
	return c
}

// pluginCheck looks for vagrant-libvirt in `vagrant plugin list
// --machine-readable` (plugin-name lines; Debian's package is a system
// plugin, listed like the others).
func (d *Driver) pluginCheck(ctx context.Context, haveVagrant bool) driver.Check {
	c := driver.Check{Name: Plugin, Hint: "`sudo agent-vm setup --backend vagrant` installs it (Debian package vagrant-libvirt)"}
	if !haveVagrant {
		c.Detail = "not checked: vagrant is missing"
		return c
	}
	env := []string{"VAGRANT_CHECKPOINT_DISABLE=1"}
	if d.Home != "" {
		env = append(env, "VAGRANT_HOME="+d.Home)
	}
	res, err := d.Run.Run(ctx, execx.Cmd{Path: "vagrant", Args: []string{"plugin", "list", "--machine-readable"}, Env: env})
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	var names []string
	version := ""
	for _, l := range ParseMachineReadable(res.Stdout) {
		switch {
		case l.Type == "plugin-name" && len(l.Data) > 0:
			names = append(names, l.Data[0])
		case l.Type == "plugin-version" && len(l.Data) > 0 && len(names) > 0 && names[len(names)-1] == Plugin:
			version = l.Data[0]
		}
	}
	var others []string
	for _, n := range names {
		if n != Plugin {
			others = append(others, n)
		}
	}
	if len(others) < len(names) {
		c.OK, c.Detail, c.Hint = true, strings.TrimSpace(Plugin+" "+version), ""
		if len(others) > 0 {
			c.Detail += "; other plugins: " + strings.Join(others, ", ")
		}
		return c
	}
	c.Detail = "not among vagrant's plugins"
	if len(names) > 0 {
		c.Detail += " (" + strings.Join(names, ", ") + ")"
	}
	return c
}

// libvirtCheck asks libvirtd for its version over the driver's connection.
func (d *Driver) libvirtCheck(ctx context.Context) driver.Check {
	c := driver.Check{Name: "libvirt (" + d.uri() + ")"}
	if _, err := d.Run.LookPath("virsh"); err != nil {
		c.Detail, c.Hint = "virsh not found", hostpkgs.InstallHint("virsh")
		return c
	}
	res, err := d.Run.Run(ctx, execx.Cmd{Path: "virsh", Args: []string{"-c", d.uri(), "version"}})
	if err != nil {
		c.Detail = "libvirtd is not running or not reachable: " + oneLine(err)
		c.Hint = "start it: `sudo systemctl start libvirtd` (without systemd: `sudo libvirtd -d` and `sudo virtlogd -d`); as a user, join the libvirt group"
		return c
	}
	c.OK = true
	c.Detail = LibvirtVersion(string(res.Stdout))
	if missing, err := (hostpkgs.Host{Run: d.Run, Root: d.HostRoot}).KVMGroupAccessMissing(); err == nil && missing {
		// Slow, not broken: the check stays ok (see KVMGroupAccessMissing).
		c.Detail += "; its QEMU user cannot use " + hostpkgs.KVMDevice + ", so libvirt probes QEMU again at every call (about a minute per vagrant up)"
		c.Hint = "`sudo agent-vm setup --backend vagrant` lets group " + hostpkgs.KVMGroup + " use it, as udev would"
	}
	return c
}

func oneLine(err error) string {
	var e *execx.Error
	if errors.As(err, &e) && e.Stderr != "" {
		return strings.Join(strings.Fields(e.Stderr), " ")
	}
	return err.Error()
}

// Share is virtiofs when the host has virtiofsd (libvirt starts it for
// the synced folder), else 9p.
func (d *Driver) Share(context.Context) (driver.ShareMode, error) {
	p, err := hostpkgs.Lookup("virtiofsd")
	if err != nil {
		return driver.Share9p, err
	}
	if _, ok := (hostpkgs.Host{Run: d.Run}).Find(p); !ok {
		return driver.Share9p, fmt.Errorf("virtiofsd is not installed (%s)", p.PackageHint())
	}
	return driver.ShareVirtiofs, nil
}

// LibvirtVersion sums up `virsh version`: "libvirt 9.0.0, hypervisor QEMU
// 7.2.0" from its "Using library:" and "Running hypervisor:" lines.
func LibvirtVersion(out string) string {
	var parts []string
	for _, l := range strings.Split(out, "\n") {
		key, val, ok := strings.Cut(l, ":")
		switch key = strings.ToLower(strings.TrimSpace(key)); {
		case !ok:
		case key == "using library":
			parts = append(parts, strings.TrimSpace(val))
		case key == "running hypervisor":
			parts = append(parts, "hypervisor "+strings.TrimSpace(val))
		}
	}
	if len(parts) == 0 {
		return "libvirtd answers (its version is not in `virsh version`)"
	}
	return strings.Join(parts, ", ")
}
