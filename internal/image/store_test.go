package image

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/hostdir"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// publishFake puts a small image with a real manifest into the store.
func publishFake(t *testing.T, st *store, name string, created time.Time) string {
	t.Helper()
	work, err := st.tempDir(name)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(work, "disk.qcow2"), 100, nil)
	writeFile(t, filepath.Join(work, KernelFile), 10, nil)
	m := &Manifest{Schema: manifestSchema, Name: name, Kind: KindBuilt, BuilderVersion: BuilderVersion, Created: created,
		Disk: "disk.qcow2", Format: "qcow2", Kernel: KernelFile, Cmdline: "root=/dev/vda"}
	if err := writeManifest(filepath.Join(work, ManifestFile), m); err != nil {
		t.Fatal(err)
	}
	dir, err := st.publish(name, work, created)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPublishLookupList(t *testing.T) {
	root := t.TempDir()
	st, err := openStore(cacheAt(root), os.Geteuid())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	first := publishFake(t, st, "debian-bookworm", t0)
	img, err := Lookup(root, "debian-bookworm")
	if err != nil {
		t.Fatal(err)
	}
	if img.Dir != first || img.Disk != filepath.Join(first, "disk.qcow2") || img.Kernel != filepath.Join(first, KernelFile) ||
		img.Initrd != "" || img.Cmdline != "root=/dev/vda" || img.Format != "qcow2" {
		t.Errorf("got %+v", img)
	}

	// A rebuild publishes a new version; the old one stays for the overlays
	// that name it.
	second := publishFake(t, st, "debian-bookworm", t0) // same second: the id gets a suffix
	if second == first {
		t.Fatalf("second publish reused %s", first)
	}
	img, err = Lookup(root, "debian-bookworm")
	if err != nil {
		t.Fatal(err)
	}
	if img.Dir != second {
		t.Errorf("lookup after rebuild: got %s, want %s", img.Dir, second)
	}
	if _, err := os.Stat(filepath.Join(first, "disk.qcow2")); err != nil {
		t.Errorf("old version's disk is gone: %v", err)
	}

	publishFake(t, st, "alpha", t0)
	imgs, err := List(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range imgs {
		names = append(names, i.Name)
	}
	if strings.Join(names, ",") != "alpha,debian-bookworm" {
		t.Errorf("list: got %q", names)
	}
	if left, _ := filepath.Glob(filepath.Join(root, tmpDir, "*")); len(left) > 0 {
		t.Errorf("work files left in .tmp: %q", left)
	}
}

func TestPruneKeepsCurrentAndInUseVersions(t *testing.T) {
	root := t.TempDir()
	st, err := openStore(cacheAt(root), os.Geteuid())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	oldFree := publishFake(t, st, "debian-bookworm", t0)
	oldUsed := publishFake(t, st, "debian-bookworm", t0.Add(time.Hour))
	current := publishFake(t, st, "debian-bookworm", t0.Add(2*time.Hour))
	other := publishFake(t, st, "debian-12", t0)
	var asked []string
	removed, err := Prune(context.Background(), cacheAt(root), func(disk string) bool {
		asked = append(asked, disk)
		return disk == filepath.Join(oldUsed, "disk.qcow2")
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != oldFree {
		t.Errorf("removed %q, want only %s", removed, oldFree)
	}
	for _, dir := range []string{oldUsed, current, other} {
		if _, err := os.Stat(filepath.Join(dir, "disk.qcow2")); err != nil {
			t.Errorf("%s was removed: %v", dir, err)
		}
	}
	for _, a := range asked {
		if !filepath.IsAbs(a) || strings.HasPrefix(a, current) || strings.HasPrefix(a, other) {
			t.Errorf("inUse asked about %s; current versions must not even be asked", a)
		}
	}
	if _, err := Lookup(root, "debian-bookworm"); err != nil {
		t.Errorf("current image after prune: %v", err)
	}
}

func TestLookupErrors(t *testing.T) {
	root := t.TempDir()
	_, err := Lookup(root, "debian-bookworm")
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("empty cache: got %v, want ErrNotFound", err)
	}
	wantErr(t, err, "agent-vm image build")

	st, err := openStore(cacheAt(root), os.Geteuid())
	if err != nil {
		t.Fatal(err)
	}
	dir := publishFake(t, st, "broken", time.Now())
	if err := os.Remove(filepath.Join(dir, "disk.qcow2")); err != nil {
		t.Fatal(err)
	}
	_, err = Lookup(root, "broken")
	wantErr(t, err, `image "broken" is damaged`, "hint:")
	if errors.Is(err, ErrNotFound) {
		t.Error("a damaged image must not read as not found")
	}
	imgs, err := List(root)
	if len(imgs) != 0 || err == nil {
		t.Errorf("list with a damaged image: got %d images, err %v", len(imgs), err)
	}

	_, err = Lookup(root, "../etc")
	wantErr(t, err, "invalid image name")
}

func TestLockWaitsAndHonoursContext(t *testing.T) {
	st, err := openStore(cacheAt(t.TempDir()), os.Geteuid())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	unlock, err := st.lock(ctx, "x", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// A second holder (another descriptor, as another process would have)
	// must wait; cancellation ends the wait with a clear error.
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	var progress strings.Builder
	_, err = st.lock(cctx, "x", &progress)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want a deadline error while the lock is held", err)
	}
	if !strings.Contains(progress.String(), "waiting for another build or pull of x") {
		t.Errorf("progress: got %q", progress.String())
	}

	got := make(chan error, 1)
	go func() {
		u, err := st.lock(ctx, "x", io.Discard)
		if err == nil {
			u()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second lock returned %v while the first was held", err)
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second lock never got the lock after unlock")
	}
}

func TestStoreGivesNewFilesToTheCacheOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		tu.SkipOrFail(t, "changing file ownership needs root")
	}
	home := t.TempDir()
	const uid, gid = 4321, 4322
	if err := os.Chown(home, uid, gid); err != nil {
		t.Fatal(err)
	}
	// As hostdir.Table has it under sudo: the user's cache directory (0711),
	// images in it (0755).
	root := hostdir.Top(filepath.Join(home, ".cache", "agent-vm"), 0o711, hostdir.InXDG).Sub("images", 0o755)
	st, err := openStore(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := st.lock(context.Background(), "debian-bookworm", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	publishFake(t, st, "debian-bookworm", time.Now())
	err = filepath.Walk(filepath.Join(home, ".cache"), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if s := fi.Sys().(*syscall.Stat_t); s.Uid != uid || s.Gid != gid {
			t.Errorf("%s belongs to %d:%d, want %d:%d", p, s.Uid, s.Gid, uid, gid)
		}
		return nil
	})
	for p, mode := range map[string]os.FileMode{filepath.Join(home, ".cache"): 0o700, root.Parent.Path: 0o711, root.Path: 0o755} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want %04o", p, fi.Mode(), err, mode)
		}
	}
	if err != nil {
		t.Fatal(err)
	}

	// A root-owned cache (or a non-root process) leaves ownership alone.
	st, err = openStore(cacheAt(filepath.Join(t.TempDir(), "images")), 0)
	if err != nil || st.uid != -1 {
		t.Errorf("root-owned cache: uid %d, %v; want -1", st.uid, err)
	}
}

func TestRemoveTreeDetachesLeftoverMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		tu.SkipOrFail(t, "mounting a tmpfs needs root")
	}
	root := t.TempDir()
	proc := filepath.Join(root, "rootfs", "proc")
	if err := os.MkdirAll(proc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", proc, "tmpfs", 0, "size=1m"); err != nil {
		tu.SkipOrFail(t, "cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(proc, syscall.MNT_DETACH) })
	writeFile(t, filepath.Join(proc, "keep-me-out"), 10, nil)

	if err := removeTree(filepath.Join(root, "rootfs")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "rootfs")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("rootfs still there: %v", err)
	}
	mounts, err := mountsUnder("/proc/self/mountinfo", root)
	if err != nil || len(mounts) > 0 {
		t.Errorf("mounts left under %s: %q (%v)", root, mounts, err)
	}
}

func TestMountsUnderParsesMountinfo(t *testing.T) {
	info := filepath.Join(t.TempDir(), "mountinfo")
	content := strings.Join([]string{
		`22 1 0:21 / /proc rw,nosuid - proc proc rw`,
		`90 1 0:50 / /cache/.tmp/x.1/rootfs/sys rw - sysfs sysfs rw`,
		`91 90 0:51 / /cache/.tmp/x.1/rootfs/sys/fs/cgroup rw - cgroup2 cgroup2 rw`,
		`92 1 0:52 / /cache/.tmp/x.1/rootfs/dev/my\040disk rw - devtmpfs udev rw`,
		`93 1 0:53 / /cache/.tmp/x.10/rootfs/proc rw - proc proc rw`,
	}, "\n")
	if err := os.WriteFile(info, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := mountsUnder(info, "/cache/.tmp/x.1")
	if err != nil {
		t.Fatal(err)
	}
	want := "/cache/.tmp/x.1/rootfs/sys/fs/cgroup|/cache/.tmp/x.1/rootfs/dev/my disk|/cache/.tmp/x.1/rootfs/sys"
	if strings.Join(got, "|") != want {
		t.Errorf("got %q, want %q", strings.Join(got, "|"), want)
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"debian-bookworm", "ubuntu-24.04", "a", "x_1"} {
		if err := validName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".hidden", "-x", "a/b", "..", "a b", strings.Repeat("a", 65)} {
		if err := validName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// An overlay registered with MarkUsed keeps its base version through Prune,
// whatever inUse says, until the overlay is gone.
func TestPruneKeepsVersionsWithRegisteredOverlays(t *testing.T) {
	cache := t.TempDir()
	old := filepath.Join(cache, storeDir, "img", "20260101T000000Z")
	cur := filepath.Join(cache, storeDir, "img", "20260201T000000Z")
	for _, d := range []string{old, cur} {
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, ManifestFile), []byte(`{"schema":1,"name":"img","kind":"built","disk":"disk.qcow2","format":"qcow2"}`), 0o644)
		os.WriteFile(filepath.Join(d, "disk.qcow2"), []byte("disk"), 0o644)
	}
	os.Symlink(filepath.Join(storeDir, "img", "20260201T000000Z"), filepath.Join(cache, "img"))
	overlay := filepath.Join(t.TempDir(), "elsewhere", "disk.qcow2")
	os.MkdirAll(filepath.Dir(overlay), 0o700)
	os.WriteFile(overlay, []byte("overlay"), 0o600)
	if err := MarkUsed(filepath.Join(old, "disk.qcow2"), overlay); err != nil {
		t.Fatal(err)
	}
	never := func(string) bool { return false }
	removed, err := Prune(context.Background(), cacheAt(cache), never)
	if err != nil || len(removed) != 0 {
		t.Fatalf("pruned %v (%v) while a registered overlay exists", removed, err)
	}
	os.Remove(overlay)
	removed, err = Prune(context.Background(), cacheAt(cache), never)
	if err != nil || len(removed) != 1 || removed[0] != old {
		t.Errorf("after the overlay went: removed %v, %v; want %s", removed, err, old)
	}
	if _, err := os.Stat(cur); err != nil {
		t.Errorf("the current version went: %v", err)
	}
}
