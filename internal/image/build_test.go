package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

const fakeKernel = "6.1.0-99-amd64"

// fakeBuildTools is a FAKE runner at the exec boundary that plays
// mmdebstrap (it lays out a minimal root filesystem), chroot (lsinitramfs,
// dpkg-query), mkfs.ext4 and qemu-img. Everything above the exec boundary
// (the store, locking, checks, manifest, publishing) is real.
type fakeBuildTools struct {
	*execxtest.Fake
	mmdebstraps atomic.Int32
	// mmdebstrap, when set, runs inside the fake mmdebstrap after the tree is
	// laid out; a non-zero reply fails it.
	mmdebstrap func(rootfs string) execxtest.Reply
	modules    []string // in modules.dep; default requiredModules()
	initrd     []string // module names in the initrd; default initrdModules()
	hostKeys   bool
	size       int64
}

func newFakeBuildTools(t *testing.T) *fakeBuildTools {
	f := &fakeBuildTools{Fake: execxtest.New(t), modules: requiredModules(), initrd: initrdModules(), size: DefaultSizeBytes}
	f.Installed("mmdebstrap", "/usr/bin/mmdebstrap") // run through unshare, below
	f.On("unshare", func(c execxtest.Call) execxtest.Reply {
		if len(c.Args) < 5 || strings.Join(c.Args[:5], " ") != "--mount --propagation private -- mmdebstrap" {
			return execxtest.Reply{ExitCode: 2, Stderr: fmt.Sprintf("unexpected unshare %q", c.Args)}
		}
		f.mmdebstraps.Add(1)
		rootfs := c.Args[5:][len(c.Args[5:])-4] // before the three sources lines
		if err := f.layOut(rootfs); err != nil {
			return execxtest.Reply{ExitCode: 1, Stderr: err.Error()}
		}
		if f.mmdebstrap != nil {
			if r := f.mmdebstrap(rootfs); r.ExitCode != 0 || r.Err != nil {
				return r
			}
		}
		return execxtest.Reply{Stderr: "I: fake mmdebstrap: success\n"}
	})
	f.On("chroot", func(c execxtest.Call) execxtest.Reply {
		switch c.Args[1] {
		case "lsinitramfs":
			var b strings.Builder
			for _, m := range f.initrd {
				fmt.Fprintf(&b, "usr/lib/modules/%s/kernel/x/%s.ko\n", fakeKernel, m)
			}
			return execxtest.Reply{Stdout: b.String()}
		case "dpkg-query":
			var b strings.Builder
			for _, p := range append(guestPackages(debianArch{kernel: "linux-image-amd64"}), "libc6") {
				fmt.Fprintf(&b, "ii \t%s\t1.0-1\tamd64\n", p)
			}
			b.WriteString("rc \tremoved-pkg\t0.1\tamd64\n")
			return execxtest.Reply{Stdout: b.String()}
		}
		return execxtest.Reply{ExitCode: 127, Stderr: "unexpected chroot command"}
	})
	f.On("mkfs.ext4", func(c execxtest.Call) execxtest.Reply {
		raw := c.Args[len(c.Args)-1]
		fi, err := os.Stat(raw)
		if err != nil || fi.Size() != f.size {
			return execxtest.Reply{ExitCode: 1, Stderr: fmt.Sprintf("raw file %v, %v: want %d bytes", fi, err, f.size)}
		}
		return execxtest.Reply{}
	})
	f.On("qemu-img", func(c execxtest.Call) execxtest.Reply {
		switch c.Args[0] {
		case "convert":
			if err := os.WriteFile(c.Args[len(c.Args)-1], []byte("QFI\xfbfake qcow2"), 0o644); err != nil {
				return execxtest.Reply{ExitCode: 1, Stderr: err.Error()}
			}
			return execxtest.Reply{}
		case "info":
			return execxtest.Reply{Stdout: fmt.Sprintf(`{"format":"qcow2","virtual-size":%d,"actual-size":4096}`, f.size)}
		}
		return execxtest.Reply{ExitCode: 1, Stderr: "unexpected qemu-img command"}
	})
	return f
}

// layOut makes the parts of a root filesystem that Build checks.
func (f *fakeBuildTools) layOut(rootfs string) error {
	mods := filepath.Join(rootfs, "usr", "lib", "modules", fakeKernel)
	for _, d := range []string{filepath.Join(rootfs, "boot"), mods, filepath.Join(rootfs, "etc", "ssh")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	var dep strings.Builder
	for _, m := range f.modules {
		fmt.Fprintf(&dep, "kernel/x/%s.ko: kernel/x/dep.ko\n", strings.ReplaceAll(m, "_", "-"))
	}
	files := map[string]string{
		filepath.Join(rootfs, "boot", "vmlinuz-"+fakeKernel):    "kernel",
		filepath.Join(rootfs, "boot", "initrd.img-"+fakeKernel): "initrd",
		filepath.Join(mods, "modules.dep"):                      dep.String(),
		filepath.Join(mods, "modules.builtin"):                  "kernel/crypto/crc32c.ko\n",
		filepath.Join(rootfs, "etc", "ssh", "sshd_config"):      "",
	}
	if f.hostKeys {
		files[filepath.Join(rootfs, "etc", "ssh", "ssh_host_ed25519_key")] = "secret"
	}
	for p, body := range files {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// testBuilder returns a builder that believes it runs as root.
func testBuilder(t *testing.T, f *fakeBuildTools, cache string, opts BuildOptions) (*builder, *syncBuilder) {
	t.Helper()
	progress := &syncBuilder{b: &strings.Builder{}}
	opts.Cache, opts.Runner, opts.Progress = cacheAt(cache), f, progress
	b, err := newBuilder(opts)
	if err != nil {
		t.Fatal(err)
	}
	b.geteuid = func() int { return 0 }
	return b, progress
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// cacheLeftovers lists work directories and partial files in a cache.
func cacheLeftovers(t *testing.T, cache string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(cache, tmpDir, "*"))
	return m
}

func TestBuildWithFakeTools(t *testing.T) {
	f := newFakeBuildTools(t)
	cache := t.TempDir()
	b, progress := testBuilder(t, f, cache, BuildOptions{})
	img, err := b.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := img.Manifest
	if img.Name != "debian-bookworm" || m.Kind != KindBuilt || m.Release != "bookworm" || m.Arch != b.arch.deb ||
		m.Mirror != DefaultMirror || m.SecurityMirror != DefaultSecurityMirror || m.KernelVersion != fakeKernel ||
		m.Cmdline != "root=/dev/vda rw console="+b.arch.console+",115200" || m.BuilderVersion != BuilderVersion ||
		m.VirtualSizeBytes != DefaultSizeBytes || m.SizeBytes != int64(len("QFI\xfbfake qcow2")) || len(m.SHA256) != 64 {
		t.Errorf("manifest: %+v", m)
	}
	if len(m.Packages) != len(guestPackages(b.arch))+1 || m.Packages[0].Version != "1.0-1" {
		t.Errorf("packages: got %+v (removed ones must not count)", m.Packages)
	}
	if strings.Join(m.Modules, ",") != strings.Join(requiredModules(), ",") {
		t.Errorf("modules: got %q", m.Modules)
	}
	for path, want := range map[string]string{img.Kernel: "kernel", img.Initrd: "initrd"} {
		if got, err := os.ReadFile(path); err != nil || string(got) != want {
			t.Errorf("%s: got %q, %v", path, got, err)
		}
	}
	entries, _ := os.ReadDir(img.Dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "disk.qcow2,initrd.img,manifest.json,vmlinuz" {
		t.Errorf("image directory holds %q, want only the disk, kernel, initrd and manifest", names)
	}
	for _, want := range []string{"building a Debian bookworm root filesystem", "I: fake mmdebstrap: success",
		"checking the root filesystem", "making a 4.0 GiB ext4 filesystem", "converting to qcow2", "built debian-bookworm"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress)
		}
	}
	if left := cacheLeftovers(t, cache); len(left) > 0 {
		t.Errorf("work directories left: %q", left)
	}

	// A second Build reuses it; Force builds a new version beside it.
	b2, progress2 := testBuilder(t, f, cache, BuildOptions{})
	img2, err := b2.run(context.Background())
	if err != nil || img2.Dir != img.Dir || f.mmdebstraps.Load() != 1 {
		t.Fatalf("second build: %v, %v, %d mmdebstrap runs", img2, err, f.mmdebstraps.Load())
	}
	if !strings.Contains(progress2.String(), "using cached image debian-bookworm") {
		t.Errorf("progress: %q", progress2)
	}
	b3, _ := testBuilder(t, f, cache, BuildOptions{Force: true})
	img3, err := b3.run(context.Background())
	if err != nil || img3.Dir == img.Dir || f.mmdebstraps.Load() != 2 {
		t.Fatalf("forced build: %v, %v, %d mmdebstrap runs", img3, err, f.mmdebstraps.Load())
	}
	if _, err := os.Stat(img.Disk); err != nil {
		t.Errorf("the old version's disk must stay for existing overlays: %v", err)
	}
}

func TestBuildArgsGolden(t *testing.T) {
	b, err := newBuilder(BuildOptions{Runner: execxtest.New(t), Cache: cacheAt("/cache")})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := debianArchFor("amd64")
	args := mmdebstrapArgs(b.opts, a, "/cache/.tmp/debian-bookworm.123/hooks", "/cache/.tmp/debian-bookworm.123/rootfs")
	got := strings.Join(args, "\n") + "\n"
	testutil.Golden(t, filepath.Join("testdata", "mmdebstrap-args.golden"), []byte(got))
}

func TestBuildOptionDefaultsAndErrors(t *testing.T) {
	r := execxtest.New(t)
	b, err := newBuilder(BuildOptions{Runner: r, Cache: cacheAt("/c"), Release: "trixie", Mirror: "http://mirror.example/debian/"})
	if err != nil {
		t.Fatal(err)
	}
	if b.opts.Name != "debian-trixie" || b.opts.Mirror != "http://mirror.example/debian" ||
		b.opts.SecurityMirror != "http://mirror.example/debian-security" || b.opts.SizeBytes != DefaultSizeBytes {
		t.Errorf("defaults: %+v", b.opts)
	}
	b, _ = newBuilder(BuildOptions{Runner: r, Cache: cacheAt("/c"), Mirror: "http://localhost:3142/apt"})
	if b.opts.SecurityMirror != DefaultSecurityMirror {
		t.Errorf("security mirror for a non-/debian mirror: got %q", b.opts.SecurityMirror)
	}
	if got := aptSources(BuildOptions{Mirror: "M", SecurityMirror: "S", Release: "sid"}); len(got) != 1 {
		t.Errorf("sid has no -updates or -security: got %q", got)
	}
	for _, tc := range []struct {
		opts BuildOptions
		want string
	}{
		{BuildOptions{Release: "Bookworm!"}, "invalid Debian release"},
		{BuildOptions{Mirror: "deb.debian.org/debian"}, "invalid mirror URL"},
		{BuildOptions{Mirror: "http://x/debian main contrib"}, "invalid mirror URL"},
		{BuildOptions{SizeBytes: 512 << 20}, "invalid image size"},
		{BuildOptions{SizeBytes: 4<<30 + 1}, "invalid image size"},
		{BuildOptions{Name: "../x"}, "invalid image name"},
	} {
		tc.opts.Runner, tc.opts.Cache = r, cacheAt("/c")
		_, err := newBuilder(tc.opts)
		wantErr(t, err, tc.want)
	}
	_, err = newBuilder(BuildOptions{})
	wantErr(t, err, "no runner")
}

func TestBuildNeedsRootAndTools(t *testing.T) {
	f := execxtest.New(t).Installed("mmdebstrap", "").Installed("qemu-img", "").
		Installed("mkfs.ext4", "/sbin/mkfs.ext4").Installed("unshare", "/bin/unshare").Installed("chroot", "/sbin/chroot")
	cache := filepath.Join(t.TempDir(), "cache")
	b, err := newBuilder(BuildOptions{Runner: f, Cache: cacheAt(cache)})
	if err != nil {
		t.Fatal(err)
	}
	b.geteuid = func() int { return 1000 }
	_, err = b.run(context.Background())
	wantErr(t, err, "building an image needs root", "sudo agent-vm image build", "agent-vm image pull debian-12",
		"needs mmdebstrap, qemu-img", "apt-get install mmdebstrap qemu-utils")
	if len(f.Calls()) != 0 {
		t.Errorf("ran %d programs before the preflight passed", len(f.Calls()))
	}
	if _, err := os.Stat(cache); err == nil {
		t.Error("the cache was created although the build could not start")
	}
}

func TestBuildFailuresLeaveNoImage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(f *fakeBuildTools)
		want  []string
	}{
		{"mmdebstrap fails", func(f *fakeBuildTools) {
			f.mmdebstrap = func(string) execxtest.Reply {
				return execxtest.Reply{ExitCode: 1, Stderr: "E: Unable to locate package cloud-init"}
			}
		}, []string{"mmdebstrap failed", "Unable to locate package", "deb.debian.org"}},
		{"module missing", func(f *fakeBuildTools) { f.modules = []string{"virtio_pci", "virtio_blk", "ext4", "virtio_net"} },
			[]string{"lacks the modules virtiofs, 9p, 9pnet_virtio, isofs, qemu_fw_cfg"}},
		{"initrd without virtio_blk", func(f *fakeBuildTools) { f.initrd = []string{"virtio_pci", "ext4"} },
			[]string{"initrd", "lacks virtio_blk"}},
		{"host keys left", func(f *fakeBuildTools) { f.hostKeys = true }, []string{"SSH host keys"}},
		{"mkfs fails", func(f *fakeBuildTools) {
			f.On("mkfs.ext4", func(execxtest.Call) execxtest.Reply {
				return execxtest.Reply{ExitCode: 1, Stderr: "__populate_fs: Could not allocate block"}
			})
		}, []string{"making the ext4 filesystem", "Could not allocate block"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeBuildTools(t)
			tc.setup(f)
			cache := t.TempDir()
			b, _ := testBuilder(t, f, cache, BuildOptions{})
			_, err := b.run(context.Background())
			wantErr(t, err, tc.want...)
			if _, lerr := Lookup(cache, "debian-bookworm"); !errors.Is(lerr, ErrNotFound) {
				t.Errorf("an image was published: %v", lerr)
			}
			if left := cacheLeftovers(t, cache); len(left) > 0 {
				t.Errorf("work directories left: %q", left)
			}
		})
	}
}

func TestBuildCancelledLeavesNoImage(t *testing.T) {
	f := newFakeBuildTools(t)
	ctx, cancel := context.WithCancel(context.Background())
	f.mmdebstrap = func(string) execxtest.Reply { cancel(); return execxtest.Reply{} }
	cache := t.TempDir()
	b, _ := testBuilder(t, f, cache, BuildOptions{})
	_, err := b.run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if left := cacheLeftovers(t, cache); len(left) > 0 {
		t.Errorf("work directories left: %q", left)
	}
	// A leftover from a killed process (no defer ran) is swept by the next build.
	stale := filepath.Join(cache, tmpDir, "debian-bookworm.12345", "rootfs", "usr")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	f.mmdebstrap = nil
	b, _ = testBuilder(t, f, cache, BuildOptions{})
	if _, err := b.run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := cacheLeftovers(t, cache); len(left) > 0 {
		t.Errorf("stale work directories not swept: %q", left)
	}
}

func TestConcurrentBuildsShareOneResult(t *testing.T) {
	f := newFakeBuildTools(t)
	started := make(chan struct{})
	release := make(chan struct{})
	f.mmdebstrap = func(string) execxtest.Reply {
		close(started)
		<-release
		return execxtest.Reply{}
	}
	cache := t.TempDir()
	b1, _ := testBuilder(t, f, cache, BuildOptions{})
	b2, progress2 := testBuilder(t, f, cache, BuildOptions{Force: true}) // even forced, it waits and reuses
	var wg sync.WaitGroup
	imgs := make([]*Image, 2)
	errs := make([]error, 2)
	first := make(chan struct{})
	wg.Add(1)
	go func() { defer wg.Done(); defer close(first); imgs[0], errs[0] = b1.run(context.Background()) }()
	select {
	case <-started:
	case <-first:
		t.Fatalf("first build ended before mmdebstrap: %v", errs[0])
	}
	wg.Add(1)
	go func() { defer wg.Done(); imgs[1], errs[1] = b2.run(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := testutil.Poll(ctx, "the second build to wait for the first", func() bool { return strings.Contains(progress2.String(), "waiting for another build") }); err != nil {
		t.Errorf("%v; its progress:\n%s", err, progress2)
	}
	close(release)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if imgs[0].Dir != imgs[1].Dir || f.mmdebstraps.Load() != 1 {
		t.Errorf("got %s and %s after %d mmdebstrap runs, want one build shared", imgs[0].Dir, imgs[1].Dir, f.mmdebstraps.Load())
	}
	if !strings.Contains(progress2.String(), "waiting for another build or pull of debian-bookworm") {
		t.Errorf("second build did not say it waited:\n%s", progress2)
	}
}

func TestBuildChecksFreeSpaceFirst(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "mounting a small tmpfs needs root")
	}
	cache := t.TempDir()
	if err := syscall.Mount("tmpfs", cache, "tmpfs", 0, "size=64m"); err != nil {
		testutil.SkipOrFail(t, "cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(cache, syscall.MNT_DETACH) })
	f := newFakeBuildTools(t)
	b, _ := testBuilder(t, f, cache, BuildOptions{})
	_, err := b.run(context.Background())
	wantErr(t, err, "needs about 3.0 GiB free in "+cache, "only 64.0 MiB is available", "hint:")
	if n := f.mmdebstraps.Load(); n != 0 {
		t.Errorf("mmdebstrap ran %d times on a full disk", n)
	}
}

func TestMkfsRefusesATooSmallDisk(t *testing.T) {
	f := newFakeBuildTools(t)
	b, _ := testBuilder(t, f, t.TempDir(), BuildOptions{})
	b.opts.SizeBytes = 1 << 20
	rootfs := t.TempDir()
	big := make([]byte, 2<<20)
	big[0] = 1
	if err := os.WriteFile(filepath.Join(rootfs, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	err := b.mkfs(context.Background(), rootfs, filepath.Join(t.TempDir(), "disk.raw"))
	wantErr(t, err, "too much for a 1.0 MiB disk", "--size")
}

func TestGuestScriptsPassShellcheck(t *testing.T) {
	testutil.Program(t, "shellcheck")
	for p, shell := range map[string]string{"guest/essential.sh": "sh", "guest/customize.sh": "sh", "guest/cloud-init-stage": "bash"} {
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: "shellcheck", Args: []string{"-s", shell, p}})
		if err != nil {
			t.Errorf("%s: %v\n%s", p, err, res.Stdout)
		}
	}
}

func TestBuildWritesTheGuestFilesBesideTheHooks(t *testing.T) {
	dir := t.TempDir()
	if err := writeGuestFiles(dir); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadDir("guest")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadDir(dir)
	if len(got) != len(want) || len(want) < 2 {
		t.Fatalf("wrote %d files, want the %d in guest/", len(got), len(want))
	}
	for _, e := range want {
		src, _ := os.ReadFile(filepath.Join("guest", e.Name()))
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || string(b) != string(src) {
			t.Errorf("%s: written copy differs (%v)", e.Name(), err)
		}
	}
	// customize.sh installs each file by the name it has here.
	customize, _ := os.ReadFile(filepath.Join("guest", "customize.sh"))
	for _, e := range want {
		if n := e.Name(); n != "customize.sh" && n != "essential.sh" && !strings.Contains(string(customize), `"$files/`+n+`"`) {
			t.Errorf("customize.sh does not install %s", n)
		}
	}
}

func TestModuleName(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/fs/fuse/virtiofs.ko":                        "virtiofs",
		"kernel/net/9p/9pnet_virtio.ko.xz":                  "9pnet_virtio",
		"usr/lib/modules/6.1/kernel/crypto/crc32c-intel.ko": "crc32c_intel",
		"kernel/drivers/firmware/qemu_fw_cfg.ko.zst":        "qemu_fw_cfg",
	} {
		if got := moduleName(in); got != want {
			t.Errorf("moduleName(%q): got %q, want %q", in, got, want)
		}
	}
}
