package hostpkgs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// kvmHost is a Host rooted in a temporary directory with a stand-in
// /dev/kvm (a regular file, mode 0600) and, when gid >= 0, a kvm group.
func kvmHost(t *testing.T, gid int) (Host, string) {
	t.Helper()
	root := t.TempDir()
	dev := filepath.Join(root, "dev", "kvm")
	for _, d := range []string{filepath.Dir(dev), filepath.Join(root, "etc")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	group := "root:x:0:\n"
	if gid >= 0 {
		group += "kvm:x:" + strconv.Itoa(gid) + ":libvirt-qemu\n"
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "group"), []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	return Host{Root: root}, dev
}

// kvmGID is a group this test may give a file to: any as root (one the
// file does not have yet), else its own.
func kvmGID() int {
	if os.Geteuid() == 0 {
		return 4242
	}
	return os.Getgid()
}

func TestKVMGroupAccess(t *testing.T) {
	gid := kvmGID()
	h, dev := kvmHost(t, gid)
	missing, err := h.KVMGroupAccessMissing()
	if err != nil || !missing {
		t.Fatalf("a root-only /dev/kvm: missing %v, %v; want true", missing, err)
	}
	if err := h.GrantKVMGroupAccess(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dev)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o660 {
		t.Errorf("mode %o after the grant, want 660", got)
	}
	if got := int(fi.Sys().(*syscall.Stat_t).Gid); got != gid {
		t.Errorf("group %d after the grant, want kvm's %d", got, gid)
	}
	if missing, err := h.KVMGroupAccessMissing(); err != nil || missing {
		t.Errorf("after the grant: missing %v, %v; want false", missing, err)
	}
}

func TestKVMGroupAccessWithoutDeviceOrGroup(t *testing.T) {
	h, dev := kvmHost(t, -1)
	missing, err := h.KVMGroupAccessMissing()
	if err != nil || !missing {
		t.Errorf("no kvm group yet: missing %v, %v; want true (the packages may bring it)", missing, err)
	}
	err = h.GrantKVMGroupAccess()
	if err == nil || !strings.Contains(err.Error(), "no group kvm") || !strings.Contains(err.Error(), "groupadd") {
		t.Errorf("grant without a kvm group: %v, want one naming the group and groupadd", err)
	}
	if err := os.Remove(dev); err != nil {
		t.Fatal(err)
	}
	if missing, err := h.KVMGroupAccessMissing(); err != nil || missing {
		t.Errorf("no /dev/kvm: missing %v, %v; want false", missing, err)
	}
}
