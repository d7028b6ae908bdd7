package vagrant

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/qemuuser"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// Files of the workspace share: the socket libvirt's QEMU connects to (in
// the run directory, or the machine's handoff directory) and virtiofsd's
// output (in the logs directory).
const (
	VirtiofsdSock = virtiofsd.SocketFile
	VirtiofsdLog  = virtiofsd.LogFile
)

// shareSocket is the machine's virtiofsd socket.
func (d *Driver) shareSocket(m driver.Machine) string { return d.qemuFile(m, m.RunDir, VirtiofsdSock) }

// startShare starts agent-vm's own virtiofsd for the workspace, as the
// QEMU driver does (package virtiofsd; jailed as root: package
// sharejail), first ending one a crashed run left, and hands its socket
// to libvirt's QEMU user alone (qemuuser.GiveSocket). As root it refuses
// a virtiofsd that would run unjailed (the Rust one, or a workspace whose
// owner is unknown): what the guest's root does in the share would then
// be done as root on the host.
func (d *Driver) startShare(ctx context.Context, m driver.Machine) error {
	d.stopShare(m)
	v, err := virtiofsd.Find(ctx, d.Run)
	if err != nil {
		return fmt.Errorf("sharing the workspace: %w (the vagrant backend shares it only through agent-vm's own virtiofsd: libvirt's 9p would write as libvirt's QEMU user, not the workspace's owner)", err)
	}
	if os.Geteuid() == 0 && !v.Jailed(0, m.Share) {
		why := fmt.Sprintf("%s is not QEMU's C virtiofsd", v.Path)
		if !v.Rust {
			why = fmt.Sprintf("the workspace's owner is unknown (uid %d, gid %d)", m.Share.UID, m.Share.GID)
		}
		return fmt.Errorf("sharing the workspace: agent-vm cannot run virtiofsd in its jail here (%s), and unjailed as root it would let the guest's root create root-owned and setuid files in %s on the host (hint: install QEMU's C virtiofsd, Debian 12's qemu-system-common; for an unknown owner, recreate the VM)", why, m.Share.Source)
	}
	sock := d.shareSocket(m)
	pid, err := virtiofsd.Start(ctx, d.Run, v, virtiofsd.Spec{Share: m.Share, Socket: sock, Log: filepath.Join(m.LogsDir, VirtiofsdLog)}, virtiofsd.Options{})
	if err != nil {
		return fmt.Errorf("sharing the workspace: %w", err)
	}
	if err := qemuuser.GiveSocket(sock, d.qemuUser(), d.Log); err != nil {
		virtiofsd.Kill(pid, sock)
		return fmt.Errorf("sharing the workspace: %w", err)
	}
	return nil
}

// stopShare ends the machine's virtiofsd, if one runs. QEMU's C virtiofsd
// also exits by itself once QEMU is gone (halt, destroy, a crash).
func (d *Driver) stopShare(m driver.Machine) {
	if virtiofsd.Kill(0, d.shareSocket(m)) {
		d.Log.Debug("ended the workspace's virtiofsd", "vm", m.Name)
	}
}
