package qemuuser

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

func TestReadACL(t *testing.T) {
	got := accessACL(64055, 4)
	// version 2; user_obj rw; user 64055 r; group_obj -; mask r; other -
	want := []byte{2, 0, 0, 0, 1, 0, 6, 0, 255, 255, 255, 255, 2, 0, 4, 0, 0x37, 0xfa, 0, 0, 4, 0, 0, 0, 255, 255, 255, 255,
		0x10, 0, 4, 0, 255, 255, 255, 255, 0x20, 0, 0, 0, 255, 255, 255, 255}
	if !bytes.Equal(got, want) {
		t.Errorf("accessACL = %v\nwant      %v", got, want)
	}
	// The kernel checks the form: a malformed ACL is EINVAL.
	f := filepath.Join(t.TempDir(), "f")
	testutil.WriteFile(t, f, "x")
	if err := unix.Setxattr(f, "system.posix_acl_access", got, 0); err != nil {
		testutil.Need(t, !errors.Is(err, unix.EOPNOTSUPP), "no POSIX ACLs on the temp directory's filesystem")
		t.Errorf("the kernel refuses the ACL: %v", err)
	}
}

// GiveSocket on a real socket, with "nobody" standing in for libvirt-qemu:
// the socket becomes 0600 and that user's (as root) or gets its ACL
// entry; for a user that does not exist it stays as it is.
func TestGiveSocket(t *testing.T) {
	uid, ok := Lookup("nobody")
	testutil.Need(t, ok, "no user nobody to stand in for libvirt-qemu")
	if _, ok := Lookup("agent-vm-no-such-user"); ok {
		t.Fatal("Lookup found a user that does not exist")
	}
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(sock, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := GiveSocket(sock, "agent-vm-no-such-user", hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(sock); fi.Mode().Perm() != 0o755 {
		t.Errorf("without the user the socket's mode became %v", fi.Mode().Perm())
	}
	if err := GiveSocket(sock, "nobody", hclog.NewNullLogger()); err != nil {
		testutil.Need(t, !errors.Is(err, unix.EOPNOTSUPP), "no POSIX ACLs on the temp directory's filesystem")
		t.Fatal(err)
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the socket's mode is %v, want 0600", fi.Mode().Perm())
	}
	if st := fi.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && int(st.Uid) != uid {
		t.Errorf("the socket belongs to uid %d, want nobody's %d", st.Uid, uid)
	}
	if os.Geteuid() != 0 {
		b := make([]byte, 64)
		n, err := unix.Getxattr(sock, "system.posix_acl_access", b)
		if err != nil || !bytes.Equal(b[:n], accessACL(uid, 6)) {
			t.Errorf("the socket's ACL is %v (%v), want nobody's read and write", b[:max(n, 0)], err)
		}
	}
}
