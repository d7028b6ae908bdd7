package qemu

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// As root with QEMU dropped to the owner, the egress sockets live where
// the owner's relays can walk (root's 0711 directories) and belong to the
// owner, 0600: the owner connects, no one else does.
func TestEgressSocketsForTheOwner(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "chown needs root")
	base := filepath.Join(t.TempDir(), "agent-vm-egress")
	m := Machine{EgressDir: filepath.Join(base, "0123456789ab")}
	if err := ensureEgressDir(m); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{base, m.EgressDir} {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm() != 0o711 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("%s: %v %v; want root's, 0711", d, fi.Mode(), err)
		}
	}
	sock := m.egressFile(ProxySock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := giveSockets(&Owner{UID: 1001, GID: 1002}, sock); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1001 || st.Gid != 1002 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %d:%d %v; want 1001:1002 0600", st.Uid, st.Gid, fi.Mode())
	}
	// A shared parent someone else can write to is refused.
	if err := os.Chmod(base, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := ensureEgressDir(m); err == nil {
		t.Error("a world-writable parent was accepted")
	}
}
