package qemu

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/hostdir"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// As root with QEMU dropped to the owner, the egress sockets live where
// the owner's relays can walk (root's 0711 directories) and belong to the
// owner, 0600: the owner connects, no one else does.
func TestEgressSocketsForTheOwner(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "chown needs root")
	base := filepath.Join(t.TempDir(), "agent-vm-egress")
	d := (&Launcher{Egress: egressAt(base)}).egressDir("01234567-89ab-cdef")
	if err := d.Make(); err != nil {
		t.Fatal(err)
	}
	m := Machine{EgressDir: d.Path}
	if m.EgressDir != filepath.Join(base, "0123456789ab") {
		t.Errorf("egress directory %s, want %s", m.EgressDir, filepath.Join(base, "0123456789ab"))
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
	if err := d.Make(); err == nil {
		t.Error("a world-writable parent was accepted")
	}
}

// egressAt is an egress base at dir as hostdir.Table makes it.
func egressAt(dir string) *hostdir.Dir {
	d := hostdir.Top(dir, 0o711, hostdir.InSystem)
	d.Shared = true
	return d
}

// Under -runas QEMU spawns the relay as the owner, who cannot run a binary
// in root's 0700 directories (go test's, go run's, root's home): the relay
// runs from a copy anyone can run, named by content; copies nothing uses
// any more go.
func TestRelayIsInstalledWhereTheOwnerCanRunIt(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "running as another user needs root")
	private := filepath.Join(t.TempDir(), "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/bin/true") // coreutils: on every host
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(private, "agent-vm")
	if err := os.WriteFile(src, b, 0o755); err != nil {
		t.Fatal(err)
	}
	runAsNobody := func(path string, args ...string) error {
		cmd := exec.Command(path, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		return cmd.Run()
	}
	if err := runAsNobody(src); err == nil {
		t.Fatal("the owner ran a binary in root's 0700 directory: the test shows nothing")
	}
	// base's parents, like /run's, let anyone walk through.
	tmp := t.TempDir()
	os.Chmod(tmp, 0o711)
	os.Chmod(filepath.Dir(tmp), 0o711)
	base := filepath.Join(tmp, "agent-vm-egress")
	if err := (&Launcher{Egress: egressAt(base)}).egressDir("01234567-89ab").Make(); err != nil {
		t.Fatal(err)
	}
	// Copies of older binaries: one unused for long, one installed just
	// now (its start may not have launched QEMU yet), one a process runs.
	old, recent, inUse := filepath.Join(base, "relay-old"), filepath.Join(base, "relay-recent"), filepath.Join(base, "relay-inuse")
	for _, p := range []string{old, recent, inUse} {
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-time.Hour)
	os.Chtimes(old, long, long)
	os.Chtimes(inUse, long, long)
	user := exec.Command("sh", "-c", "sleep 30", inUse)
	if err := user.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { user.Process.Kill(); user.Wait() }()

	relay, err := installRelay(base, src)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(relay) != base {
		t.Fatalf("relay at %s, not in %s", relay, base)
	}
	fi, err := os.Stat(relay)
	if err != nil || fi.Mode().Perm() != 0o755 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("relay %v %v; want root's, 0755", fi.Mode(), err)
	}
	if err := runAsNobody(relay); err != nil {
		t.Errorf("the owner cannot run the installed relay: %v", err)
	}
	again, err := installRelay(base, src)
	if err != nil || again != relay {
		t.Errorf("second install: %s %v, want %s", again, err, relay)
	}
	for p, want := range map[string]bool{old: false, recent: true, inUse: true} {
		if _, err := os.Stat(p); (err == nil) != want {
			t.Errorf("%s kept = %v, want %v", filepath.Base(p), err == nil, want)
		}
	}
	if ents, _ := filepath.Glob(filepath.Join(base, ".*")); len(ents) != 0 {
		t.Errorf("temporary files left: %v", ents)
	}
}
