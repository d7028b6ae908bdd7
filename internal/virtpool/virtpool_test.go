package virtpool

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/hostlink/hostlinktest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
)

// connect is this machine's libvirtd over its socket, as go-libvirt
// reaches a local daemon.
func connect(t *testing.T) *libvirt.Libvirt {
	t.Helper()
	tu.Need(t, os.Geteuid() == 0, "the system libvirtd's storage API needs root")
	libvirtd.ForTest(t)
	l := libvirt.NewWithDialer(dialers.NewLocal())
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Disconnect() })
	return l
}

// testPool is a pool of the test's own (its own name and directory, so
// a host's agent-vm pool is never touched), removed with its volumes when
// the test ends.
func testPool(t *testing.T, l *libvirt.Libvirt) Pool {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	p := Pool{L: l, Name: "agent-vm-test-" + hex.EncodeToString(b), Dir: filepath.Join(t.TempDir(), "pool")}
	t.Cleanup(func() {
		if sp, err := l.StoragePoolLookupByName(p.Name); err == nil {
			vols, _, _ := l.StoragePoolListAllVolumes(sp, 1, 0)
			for _, v := range vols {
				_ = l.StorageVolDelete(v, 0)
			}
			_ = l.StoragePoolDestroy(sp)
			_ = l.StoragePoolUndefine(sp)
		}
	})
	return p
}

// qcow2 makes a small qcow2 disk image with qemu-img and returns it.
func qcow2(t *testing.T, size string) []byte {
	t.Helper()
	f := filepath.Join(t.TempDir(), "disk.qcow2")
	if out, err := exec.Command(tu.Program(t, "qemu-img"), "create", "-q", "-f", "qcow2", f, size).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func opener(b []byte, calls *int) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { *calls++; return io.NopCloser(bytes.NewReader(b)), nil }
}

// The pool against this machine's libvirtd for real: made once; a base
// uploaded once (the second call sends nothing) and an incomplete one sent
// again; a VM's overlay backed by it (qemu-img says so) and its seed
// replaced whole; prune deletes only the bases nothing is backed by and
// the caller does not keep; delete of what is gone is fine; a pool of the
// same name elsewhere is refused.
func TestPoolForReal(t *testing.T) {
	l := connect(t)
	p := testPool(t, l)
	if _, err := p.Ensure(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Ensure(); err != nil {
		t.Fatalf("a second Ensure: %v", err)
	}
	if fi, err := os.Stat(p.Dir); err != nil || fi.Mode().Perm() != 0o711 {
		t.Errorf("the pool's directory: %v %v", fi, err)
	}
	disk := qcow2(t, "16M")
	calls := 0
	base, up, err := p.Base("base-1.qcow2", "qcow2", int64(len(disk)), opener(disk, &calls))
	if err != nil || !up || calls != 1 || filepath.Dir(base.Path) != p.Dir {
		t.Fatalf("first Base: %+v up %v calls %d %v", base, up, calls, err)
	}
	if got, _ := os.ReadFile(base.Path); !bytes.Equal(got, disk) {
		t.Error("the uploaded base differs from the image")
	}
	again, up, err := p.Base("base-1.qcow2", "qcow2", int64(len(disk)), opener(disk, &calls))
	if err != nil || up || calls != 1 || again != base {
		t.Errorf("second Base: %+v up %v calls %d %v; want it found, nothing sent", again, up, calls, err)
	}
	// An upload cut off: the volume without its marker is sent again.
	if err := l.StorageVolDelete(mustVol(t, l, p, "base-1.qcow2.done"), 0); err != nil {
		t.Fatal(err)
	}
	if _, up, err := p.Base("base-1.qcow2", "qcow2", int64(len(disk)), opener(disk, &calls)); err != nil || !up || calls != 2 {
		t.Errorf("Base after an incomplete upload: up %v calls %d %v", up, calls, err)
	}

	root, err := p.Overlay("vm1-root.qcow2", base, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Format  string `json:"format"`
		Backing string `json:"full-backing-filename"`
		Virtual int64  `json:"virtual-size"`
	}
	out, err := exec.Command(tu.Program(t, "qemu-img"), "info", "--output=json", "-U", root.Path).Output()
	if err != nil || json.Unmarshal(out, &info) != nil || info.Format != "qcow2" || info.Backing != base.Path || info.Virtual != 64<<20 {
		t.Errorf("the overlay: %+v (%v)\n%s", info, err, out)
	}
	if fi, err := os.Stat(root.Path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the overlay's mode: %v %v", fi, err)
	}
	if _, err := p.Overlay("vm1-root.qcow2", base, 64<<20); err == nil {
		t.Error("a second overlay of one name replaced the first")
	}
	seed, err := p.Put("vm1-seed.iso", []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Put("vm1-seed.iso", []byte("second seed")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(seed.Path); string(got) != "second seed" {
		t.Errorf("the seed after Put again: %q", got)
	}

	old := qcow2(t, "8M")
	if _, _, err := p.Base("base-0.qcow2", "qcow2", int64(len(old)), opener(old, &calls)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Base("base-2.qcow2", "qcow2", int64(len(old)), opener(old, &calls)); err != nil {
		t.Fatal(err)
	}
	pruned, err := p.Prune("base-2.qcow2")
	if err != nil || !slices.Equal(pruned, []string{"base-0.qcow2"}) {
		t.Errorf("Prune: %q %v; want only the base nothing uses and not kept", pruned, err)
	}
	for _, gone := range []string{"base-0.qcow2", "base-0.qcow2.done"} {
		if _, err := os.Stat(filepath.Join(p.Dir, gone)); err == nil {
			t.Errorf("%s outlived Prune", gone)
		}
	}
	if err := p.Delete("vm1-root.qcow2", "vm1-seed.iso", "never-there"); err != nil {
		t.Fatal(err)
	}
	if pruned, err := p.Prune(); err != nil || !slices.Contains(pruned, "base-1.qcow2") {
		t.Errorf("Prune once the overlay is gone: %q %v", pruned, err)
	}

	other := Pool{L: l, Name: p.Name, Dir: filepath.Join(t.TempDir(), "elsewhere")}
	if _, err := other.Ensure(); err == nil || !strings.Contains(err.Error(), "not agent-vm's at "+other.Dir) {
		t.Errorf("a pool of the name elsewhere: %v", err)
	}
	if _, _, err := p.Base("bad/name", "raw", 1, opener(nil, &calls)); err == nil {
		t.Error("a volume name with a slash was taken")
	}
}

// The same calls through agent-vm's link (internal/hostlink) to this
// machine's sshd and libvirtd, as a remote host is reached: the base is
// found, a seed written.
func TestPoolOverTheLink(t *testing.T) {
	local := connect(t)
	p := testPool(t, local)
	if _, err := p.Ensure(); err != nil {
		t.Fatal(err)
	}
	_, c := hostlinktest.Dial(t)
	rl, err := hostlink.Libvirt(c)
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Disconnect()
	remote := Pool{L: rl, Name: p.Name, Dir: p.Dir}
	if _, err := remote.Ensure(); err != nil {
		t.Fatal(err)
	}
	disk := qcow2(t, "4M")
	calls := 0
	if _, up, err := remote.Base("base.qcow2", "qcow2", int64(len(disk)), opener(disk, &calls)); err != nil || !up {
		t.Fatalf("Base over the link: up %v %v", up, err)
	}
	if _, up, err := p.Base("base.qcow2", "qcow2", int64(len(disk)), opener(disk, &calls)); err != nil || up || calls != 1 {
		t.Errorf("the local connection does not find what the link uploaded: up %v calls %d %v", up, calls, err)
	}
	seed, err := remote.Put("seed.iso", []byte("over the link"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(seed.Path); string(got) != "over the link" {
		t.Errorf("the seed written over the link: %q", got)
	}
}

func mustVol(t *testing.T, l *libvirt.Libvirt, p Pool, name string) libvirt.StorageVol {
	t.Helper()
	sp, err := l.StoragePoolLookupByName(p.Name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := l.StorageVolLookupByName(sp, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A pool whose directory went while libvirtd kept it active (removed by
// hand, or moved aside) is made again by Ensure, and takes volumes; so is
// one defined but stopped whose directory is gone.
func TestEnsureRemakesAGoneDirectory(t *testing.T) {
	l := connect(t)
	p := testPool(t, l)
	sp, err := p.Ensure()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(p.Dir); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Ensure(); err != nil {
		t.Fatalf("Ensure with the directory gone: %v", err)
	}
	if _, err := p.Put("seed.iso", []byte("x")); err != nil {
		t.Errorf("a volume in the pool made again: %v", err)
	}
	if err := l.StoragePoolDestroy(sp); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(p.Dir); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Ensure(); err != nil {
		t.Fatalf("Ensure of a stopped pool with the directory gone: %v", err)
	}
	if fi, err := os.Stat(p.Dir); err != nil || fi.Mode().Perm() != 0o711 {
		t.Errorf("the pool's directory made again: %v %v", fi, err)
	}
}
