package vagrant

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// prepareAccess on real files, with "nobody" standing in for libvirt-qemu:
// the VM's directories become searchable (not readable) by others, the
// credential reaches QEMU's user as a 0600 copy, and a directory above the
// VM's that others cannot enter fails with the fix.
func TestPrepareAccess(t *testing.T) {
	u, err := user.Lookup("nobody")
	testutil.Need(t, err == nil, "no user nobody to stand in for libvirt-qemu")
	uid, _ := strconv.Atoi(u.Uid)

	base, err := os.MkdirTemp("", "agent-vm-access-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	vmDir := filepath.Join(base, "vms", "feat")
	m := driver.Machine{Name: "agent-vm-feat", RunDir: filepath.Join(vmDir, "run"), LogsDir: filepath.Join(vmDir, "logs"),
		Credentials: []driver.Credential{{Name: "agent-vm.mcp-token", File: filepath.Join(vmDir, "secrets", "mcp-token")}}}
	testutil.WriteFile(t, m.Credentials[0].File, "s3cret")
	testutil.WriteFile(t, filepath.Join(vmDir, "seed.iso"), "iso")
	for _, d := range []string{filepath.Join(base, "vms"), vmDir, filepath.Join(vmDir, "secrets")} {
		if err := os.Chmod(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(m.RunDir, 0o700); err != nil {
		t.Fatal(err)
	}
	d := &Driver{Log: hclog.NewNullLogger(), QEMUUser: "nobody"}
	b := Boot{Seed: filepath.Join(vmDir, "seed.iso")}

	// A directory above the state directory is the user's to open up.
	_, _, err = d.prepareAccess(m, b)
	if err == nil || !strings.Contains(err.Error(), "directory "+base+" has mode 0700") || !strings.Contains(err.Error(), "AGENT_VM_STATE_DIR") {
		t.Errorf("a 0700 directory above the state directory: %v; want it named with the fix", err)
	}
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	got, _, err := d.prepareAccess(m, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(base, "vms"), vmDir, m.RunDir, filepath.Join(m.RunDir, FwCfgDir)} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o701 {
			t.Errorf("%s: mode %v (%v), want 0701: searchable, not readable by others", dir, fi.Mode().Perm(), err)
		}
	}
	if fi, _ := os.Stat(filepath.Join(vmDir, "secrets")); fi.Mode().Perm() != 0o700 {
		t.Errorf("the secrets directory was opened: %v", fi.Mode().Perm())
	}
	cp := got.Credentials[0].File
	if cp != filepath.Join(m.RunDir, FwCfgDir, "agent-vm.mcp-token") {
		t.Errorf("credential handed over as %s", cp)
	}
	fi, err := os.Stat(cp)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := os.ReadFile(cp)
	if !bytes.Equal(b2, []byte("s3cret")) || fi.Mode().Perm() != 0o600 {
		t.Errorf("the copy: %q, mode %v", b2, fi.Mode().Perm())
	}
	if os.Geteuid() == 0 {
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid {
			t.Errorf("the copy belongs to uid %d, want QEMU's user's %d", st.Uid, uid)
		}
	}
}

// prepareAccess with a handoff directory (root's default): the VM's own
// directories, under a 0700 home, stay closed; the seed and the credential
// reach QEMU's user as 0600 copies in the machine's handoff directory,
// whose directories others can search but not list.
func TestPrepareAccessHandoff(t *testing.T) {
	u, err := user.Lookup("nobody")
	testutil.Need(t, err == nil, "no user nobody to stand in for libvirt-qemu")
	uid, _ := strconv.Atoi(u.Uid)
	home := t.TempDir() // 0700, as /root
	vmDir := filepath.Join(home, "vms", "feat")
	m := driver.Machine{Name: "agent-vm-feat", UUID: "0123abcd-0000-0000-0000-000000000000", RunDir: filepath.Join(vmDir, "run"), LogsDir: filepath.Join(vmDir, "logs"),
		Credentials: []driver.Credential{{Name: "agent-vm.mcp-token", File: filepath.Join(vmDir, "secrets", "mcp-token")}}}
	testutil.WriteFile(t, m.Credentials[0].File, "s3cret")
	testutil.WriteFile(t, filepath.Join(vmDir, "seed.iso"), "iso")
	if err := os.MkdirAll(m.RunDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{home, filepath.Join(home, "vms"), vmDir} {
		if err := os.Chmod(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	outside, err := os.MkdirTemp("", "agent-vm-handoff-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outside) })
	if err := os.Chmod(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &Driver{Log: hclog.NewNullLogger(), QEMUUser: "nobody", Handoff: hostdir.Top(filepath.Join(outside, "libvirt"), 0o711, hostdir.InSystem)}
	gotM, gotB, err := d.prepareAccess(m, Boot{Seed: filepath.Join(vmDir, "seed.iso")})
	if err != nil {
		t.Fatal(err)
	}
	mdir := d.handoffDir(m).Path
	if filepath.Dir(mdir) != d.Handoff.Path || gotB.Seed != filepath.Join(mdir, SeedFile) || gotM.Credentials[0].File != filepath.Join(mdir, FwCfgDir, "agent-vm.mcp-token") {
		t.Fatalf("handed over as seed %s, credential %s; want both in %s", gotB.Seed, gotM.Credentials[0].File, mdir)
	}
	for _, dir := range []string{d.Handoff.Path, mdir, filepath.Join(mdir, FwCfgDir)} {
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o711 {
			t.Errorf("%s: %v (%v), want 0711", dir, fi.Mode().Perm(), err)
		}
	}
	for _, dir := range []string{home, vmDir, m.RunDir} {
		if fi, _ := os.Stat(dir); fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s was opened to others: %v", dir, fi.Mode().Perm())
		}
	}
	for path, want := range map[string]string{gotB.Seed: "iso", gotM.Credentials[0].File: "s3cret"} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(path); string(b) != want || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %q, mode %v; want %q, 0600", path, b, fi.Mode().Perm(), want)
		}
		if st := fi.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && int(st.Uid) != uid {
			t.Errorf("%s belongs to uid %d, want QEMU's user's %d", path, st.Uid, uid)
		}
	}
	// Destroy removes the machine's handoff directory (a machine vagrant
	// never made: nothing else to do).
	if err := d.Destroy(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mdir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after destroy, %s: %v", mdir, err)
	}
}

// TestInspectPid: a running machine's pid is its QEMU's, from libvirt's
// pid file, and only while that process is a QEMU.
func TestInspectPid(t *testing.T) {
	r := newRig(t)
	r.state = "running"
	r.d.PidDir = t.TempDir()
	if err := os.MkdirAll(Project(r.m.RunDir), 0o700); err != nil { // created: vagrant is asked
		t.Fatal(err)
	}
	// A stand-in for libvirt's QEMU: a real process whose command line
	// names qemu.
	cmd := exec.Command("sleep", "60")
	cmd.Args[0] = "qemu-system-x86_64-stand-in"
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pidFile := filepath.Join(r.d.PidDir, "agent-vm-feat-0123abcd.pid")
	for _, tc := range []struct {
		name string
		pid  int
		want int
	}{{"its QEMU", cmd.Process.Pid, cmd.Process.Pid}, {"a process that is no QEMU", os.Getpid(), 0}} {
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(tc.pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		removeMarkers(r.m, CacheFile)
		if lv, err := r.d.Inspect(context.Background(), r.m); err != nil || lv.Pid != tc.want {
			t.Errorf("%s: Inspect's pid %d (%v), want %d", tc.name, lv.Pid, err, tc.want)
		}
	}
}
