// Package qemuuser hands the files libvirt's QEMU opens to the user
// libvirt runs QEMU as, for a driver that runs QEMU through libvirt.
//
// Under qemu:///system libvirt runs QEMU as an unprivileged user of its own
// (DefaultUser on Debian) and hands it the files its domain XML names
// (disks, a seed), never their directories, and nothing passed to QEMU
// otherwise (fw_cfg files, a vhost-user socket). So a driver makes the
// directories on the way searchable by others (Searchable: search, not
// read), copies each secret for that user alone (CopyFor) and gives it the
// sockets QEMU connects to (GiveSocket). A file goes to that user and no
// one else besides its owner: owned by it when agent-vm runs as root,
// else through a POSIX ACL entry, so the secret never becomes readable by
// others. Without such a user (another distribution, a session libvirt,
// QEMU run as root) a driver leaves access as it is (Lookup says so).
package qemuuser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// DefaultUser is the user libvirt runs QEMU as under qemu:///system on
// Debian (libvirt's qemu.conf "user").
const DefaultUser = "libvirt-qemu"

// Lookup is the uid of the user name; ok is false when there is no such
// user (then QEMU runs as some other user, and access stays as it is).
func Lookup(name string) (uid int, ok bool) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, false
	}
	uid, err = strconv.Atoi(u.Uid)
	if err != nil {
		return 0, false
	}
	return uid, true
}

// Searchable adds search permission for others to dir (and nothing else).
func Searchable(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o001 != 0 {
		return nil
	}
	if err := os.Chmod(dir, fi.Mode().Perm()|0o001); err != nil {
		return fmt.Errorf("letting libvirt's QEMU through %s: %w", dir, err)
	}
	return nil
}

// CopyFor copies the secret src to dst (0600), readable by uid alone
// besides dst's owner: owned by uid when we are root, else through an ACL.
func CopyFor(src, dst string, uid int) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	_ = os.Remove(dst)
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	if err := errors.Join(werr, f.Close()); err != nil {
		return err
	}
	return Grant(dst, uid, 4)
}

// GiveSocket lets the user userName (libvirt's QEMU's), and no one else
// besides the socket's owner, connect to sock (0600): owned by it as root,
// else through an ACL entry. Without such a user (QEMU runs as root) the
// socket stays as it is.
func GiveSocket(sock, userName string, log hclog.Logger) error {
	uid, ok := Lookup(userName)
	if !ok {
		log.Debug("no user for libvirt's QEMU: leaving the socket as it is", "user", userName, "socket", sock)
		return nil
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		return err
	}
	return Grant(sock, uid, 6)
}

// Grant gives uid perm (4 read, 6 read and write) on path, a 0600 file,
// and no one else besides its owner: path becomes uid's when we are root
// (Lchown), else uid gets an ACL entry.
func Grant(path string, uid int, perm uint16) error {
	if os.Geteuid() == 0 {
		return os.Lchown(path, uid, -1)
	}
	if err := unix.Setxattr(path, "system.posix_acl_access", accessACL(uid, perm), 0); err != nil {
		return fmt.Errorf("granting uid %d access to %s with an ACL: %w (hint: the state directory's filesystem must support POSIX ACLs, or run agent-vm as root)", uid, path, err)
	}
	return nil
}

// accessACL is a POSIX access ACL (the kernel's xattr form, version 2):
// owner rw, user uid perm (4 read, 6 read and write), group and others
// nothing, mask perm.
func accessACL(uid int, perm uint16) []byte {
	const undefined = 0xffffffff
	entries := []struct {
		tag, perm uint16
		id        uint32
	}{{0x01, 6, undefined}, {0x02, perm, uint32(uid)}, {0x04, 0, undefined}, {0x10, perm, undefined}, {0x20, 0, undefined}}
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}
