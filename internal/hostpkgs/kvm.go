package hostpkgs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// KVMDevice is the KVM device, and KVMGroup the group udev gives it on
// Debian and Fedora (KERNEL=="kvm", GROUP="kvm"), of which libvirt's QEMU
// user (Debian's libvirt-qemu) is a member.
const (
	KVMDevice = "/dev/kvm"
	KVMGroup  = "kvm"
)

// KVMGroupAccessMissing reports whether /dev/kvm exists and group kvm
// cannot read and write it (or there is no kvm group yet: the packages
// setup installs may bring it).
//
// That is the one host setting setup changes besides packages. On a host
// without udev (a container, these CI machines) /dev/kvm stays root's only
// (0600), and libvirt, which probes QEMU's capabilities as root, then finds
// at every lookup that "KVM was enabled when probing, but it is not
// available now" for its QEMU user: it drops its capability cache and
// probes QEMU again, about 15 times per domain define and start (measured:
// 60 s of a first vagrant up, 20 s of a later one). udev's rule
// (KERNEL=="kvm", GROUP="kvm"), applied by hand, ends it.
func (h Host) KVMGroupAccessMissing() (bool, error) {
	fi, err := os.Stat(h.kvmDevice())
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	gid, ok, err := h.groupID(KVMGroup)
	if err != nil || !ok {
		return !ok && err == nil, err
	}
	st, isUnix := fi.Sys().(*syscall.Stat_t)
	return !isUnix || int(st.Gid) != gid || fi.Mode().Perm()&0o060 != 0o060, nil
}

// KVMGroupAccessAction says what GrantKVMGroupAccess does, for setup's
// question.
const KVMGroupAccessAction = "let group " + KVMGroup + " (libvirt's QEMU user) read and write " + KVMDevice +
	" as udev's rule would on a host that ran it (chgrp " + KVMGroup + " " + KVMDevice + " && chmod g+rw " + KVMDevice + ")"

// GrantKVMGroupAccess gives group kvm read and write access to /dev/kvm;
// the owner's and the others' bits stay as they are.
func (h Host) GrantKVMGroupAccess() error {
	gid, ok, err := h.groupID(KVMGroup)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("this host has no group %s, so libvirt's QEMU user cannot be let use %s (hint: create it, `groupadd --system %s`, add libvirt's QEMU user to it, and run setup again)", KVMGroup, KVMDevice, KVMGroup)
	}
	dev := h.kvmDevice()
	if err := os.Chown(dev, -1, gid); err != nil {
		return fmt.Errorf("giving %s to group %s: %w (hint: run setup as root)", KVMDevice, KVMGroup, err)
	}
	fi, err := os.Stat(dev)
	if err != nil {
		return err
	}
	if err := os.Chmod(dev, fi.Mode().Perm()|0o060); err != nil {
		return fmt.Errorf("letting group %s use %s: %w (hint: run setup as root)", KVMGroup, KVMDevice, err)
	}
	return nil
}

func (h Host) kvmDevice() string { return filepath.Join(h.root(), KVMDevice) }

// groupID looks name up in the host's /etc/group (under Root).
func (h Host) groupID(name string) (gid int, ok bool, err error) {
	var bad error
	var field string
	if err := h.scanDB("group", func(f []string) bool {
		if f[0] != name {
			return false
		}
		field = f[2]
		gid, bad = strconv.Atoi(field)
		ok = bad == nil
		return true
	}); err != nil {
		return 0, false, err
	}
	if bad != nil {
		return 0, false, fmt.Errorf("/etc/group: group %s has gid %q", name, field)
	}
	return gid, ok, nil
}
