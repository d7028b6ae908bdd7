package image

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// TestBuildRealImage builds the default image for real with mmdebstrap (about
// two minutes here), or reuses the one already in the cache
// ($XDG_CACHE_HOME/agent-vm/images/debian-bookworm; CI keeps it between
// runs), then checks its manifest, files and disk contents and boots it.
func TestBuildRealImage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: building a real image takes minutes")
	}
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "building an image needs root (mmdebstrap root mode)")
	}
	testutil.Program(t, "mmdebstrap")
	testutil.Program(t, "mkfs.ext4")
	testutil.Program(t, "debugfs")
	testutil.Program(t, "qemu-img")
	cache, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, "the base image build")

	start := time.Now()
	// The host's image cache, with the modes hostdir.Table gives it.
	dir := hostdir.Top(filepath.Dir(cache), 0o711, hostdir.InXDG).Sub(filepath.Base(cache), 0o755)
	img, err := Build(ctx, BuildOptions{Runner: execx.OS{}, Cache: dir, Progress: &testLogWriter{t: t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Build returned %s in %s", img.Dir, time.Since(start).Round(time.Second))

	looked, err := Lookup(cache, DefaultBuildName)
	if err != nil || looked.Dir != img.Dir {
		t.Fatalf("Lookup(%s, %s): %v, %v; want the image Build returned", cache, DefaultBuildName, looked, err)
	}
	checkRealManifest(t, img)
	checkRealDisk(t, img)
	t.Run("boot", func(t *testing.T) { bootImage(t, ctx, img) })
}

func checkRealManifest(t *testing.T, img *Image) {
	t.Helper()
	m := img.Manifest
	arch, _ := debianArchFor(runtime.GOARCH)
	if m.Kind != KindBuilt || m.BuilderVersion != BuilderVersion || m.Release != "bookworm" || m.Arch != arch.deb ||
		m.Mirror != DefaultMirror || len(m.Sources) != 3 || !strings.HasSuffix(m.Sources[2], "bookworm-security main") ||
		m.Created.IsZero() || m.BuildSeconds <= 0 || m.Cmdline != kernelCmdline(arch) || m.Format != "qcow2" ||
		m.VirtualSizeBytes != DefaultSizeBytes || m.KernelVersion == "" {
		t.Errorf("manifest: %+v", m)
	}
	versions := map[string]string{}
	for _, p := range m.Packages {
		versions[p.Name] = p.Version
	}
	for _, want := range guestPackages(arch) {
		if versions[want] == "" {
			t.Errorf("manifest lists no version of %s", want)
		}
	}
	for _, want := range []string{"virtio_blk", "virtio_net", "virtiofs", "9p", "9pnet_virtio", "qemu_fw_cfg"} {
		if !slices.ContainsFunc(m.Modules, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("manifest modules lack %s: %q", want, m.Modules)
		}
	}
	t.Logf("kernel %s, %d packages, qcow2 %s (%d bytes), virtual %s", m.KernelVersion, len(m.Packages),
		formatBytes(m.SizeBytes), m.SizeBytes, formatBytes(m.VirtualSizeBytes))

	// The qcow2 is what qemu-img says it is, and what the manifest says.
	info := gjson.Parse(run(t, "qemu-img", "info", "--output=json", img.Disk))
	if info.Get("format").String() != "qcow2" || info.Get("virtual-size").Int() != m.VirtualSizeBytes ||
		info.Get("backing-filename").Exists() || info.Get("format-specific.data.corrupt").Bool() {
		t.Errorf("qemu-img info: %s", info.Raw)
	}
	sums, err := hashFile(img.Disk, "sha256")
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(img.Disk); sums["sha256"] != m.SHA256 || fi.Size() != m.SizeBytes {
		t.Errorf("disk sha256/size: got %s/%d, manifest %s/%d", sums["sha256"], fi.Size(), m.SHA256, m.SizeBytes)
	}
	kernel, err := readHead(img.Kernel, 4096)
	if err != nil || (arch.deb == "amd64" && !at(kernel, 0x202, "HdrS")) {
		t.Errorf("kernel %s is not a bzImage (%v)", img.Kernel, err)
	}
	if fi, err := os.Stat(img.Initrd); err != nil || fi.Size() < 1<<20 || fi.Size() > 64<<20 {
		t.Errorf("initrd %s: %v %v", img.Initrd, fi, err)
	} else {
		t.Logf("initrd %s", formatBytes(fi.Size()))
	}
}

// checkRealDisk reads the image's ext4 filesystem with e2fsprogs (no mount):
// it must be clean and hold what the VMs rely on.
func checkRealDisk(t *testing.T, img *Image) {
	t.Helper()
	raw := filepath.Join(t.TempDir(), "disk.raw")
	run(t, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", img.Disk, raw)
	run(t, "e2fsck", "-f", "-n", raw)

	ls := func(dir string) map[string]string { // name -> mode (octal, as debugfs prints it)
		out := run(t, "debugfs", "-R", "ls -p "+dir, raw)
		entries := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Split(line, "/") // /inode/mode/uid/gid/name/size/
			if len(f) >= 6 {
				entries[f[5]] = f[2] + " uid=" + f[3]
			}
		}
		if len(entries) == 0 {
			t.Errorf("debugfs: %s is missing or empty", dir)
		}
		return entries
	}
	cat := func(file string) string { return run(t, "debugfs", "-R", "cat "+file, raw) }

	kmods := "/usr/lib/modules/" + img.Manifest.KernelVersion + "/kernel"
	for dir, names := range map[string][]string{
		"/usr/sbin":                  {"sshd"},
		"/usr/bin":                   {"cloud-init", "git", "curl", "python3", "node", "npm", "sudo"},
		kmods + "/fs/fuse":           {"virtiofs.ko"},
		kmods + "/fs/9p":             {"9p.ko"},
		kmods + "/net/9p":            {"9pnet_virtio.ko"},
		kmods + "/fs/isofs":          {"isofs.ko"},
		"/etc/initramfs-tools/hooks": {"agent-vm"},
	} {
		have := ls(dir)
		for _, n := range names {
			if _, ok := have[n]; !ok {
				t.Errorf("the image has no %s/%s", dir, n)
			}
		}
	}
	if mode := ls("/usr/bin")["sudo"]; mode != "104755 uid=0" {
		t.Errorf("/usr/bin/sudo: got mode %q, want setuid root (104755 uid=0): mkfs.ext4 -d must keep it", mode)
	}
	// The package lists of the build stay, with their stamp
	// (ensure-packages installs from them), and apt's package cache; the
	// downloaded packages do not.
	lists := ls("/var/lib/apt/lists")
	if !slices.ContainsFunc(slices.Collect(maps.Keys(lists)), func(n string) bool {
		return strings.HasSuffix(n, "_binary-amd64_Packages") || strings.HasSuffix(n, "_binary-arm64_Packages")
	}) {
		t.Errorf("the image keeps no package lists: /var/lib/apt/lists has %v", slices.Sorted(maps.Keys(lists)))
	}
	if _, ok := ls("/var/cache/apt")["pkgcache.bin"]; !ok {
		t.Error("the image has no apt package cache (/var/cache/apt/pkgcache.bin)")
	}
	if _, ok := ls("/var/lib/agent-vm")["package-lists"]; !ok {
		t.Error("the image has no stamp of its package lists (/var/lib/agent-vm/package-lists)")
	}
	for name := range ls("/var/cache/apt/archives") {
		if strings.HasSuffix(name, ".deb") {
			t.Errorf("the image keeps a downloaded package: /var/cache/apt/archives/%s", name)
		}
	}
	for name := range ls("/etc/ssh") {
		if strings.HasPrefix(name, "ssh_host_") {
			t.Errorf("the image carries an SSH host key: /etc/ssh/%s", name)
		}
	}
	// cloud-init's stages run through the stage server (cloud-init-server).
	for name, mode := range ls("/usr/lib/agent-vm") {
		if name != "." && name != ".." && mode != "100755 uid=0" {
			t.Errorf("/usr/lib/agent-vm/%s: mode %s, want an executable of root's", name, mode)
		}
	}
	for _, unit := range []string{"cloud-init-local", "cloud-init", "cloud-config", "cloud-final"} {
		if got := cat("/etc/systemd/system/" + unit + ".service.d/agent-vm.conf"); !strings.Contains(got, "ExecStart=/usr/lib/agent-vm/cloud-init-stage ") {
			t.Errorf("%s.service runs no stage through the server: %q", unit, got)
		}
	}
	if got := cat("/etc/cloud/cloud.cfg.d/90-agent-vm.cfg"); !strings.Contains(got, "\ncloud_final_modules: [ write-files-deferred,") {
		t.Errorf("90-agent-vm.cfg lists no modules: %q", got)
	}
	for file, want := range map[string]string{
		"/etc/systemd/system/agent-vm-cloud-init.service": "ExecStart=/usr/lib/agent-vm/cloud-init-server",
		"/usr/lib/agent-vm/cloud-init-server":             "from cloudinit.cmd.main import main",
		"/etc/cloud/cloud.cfg.d/90-agent-vm.cfg":          "datasource_list: [ NoCloud, None ]",
		"/etc/fstab":                                      "/dev/vda / ext4",
		"/etc/hostname":                                   "agent-vm",
		"/etc/modules-load.d/agent-vm.conf":               "qemu_fw_cfg",
		"/etc/machine-id":                                 "",
	} {
		if got := cat(file); !strings.Contains(got, want) || (want == "" && strings.TrimSpace(got) != "") {
			t.Errorf("%s: got %q, want it to contain %q", file, got, want)
		}
	}
}

// bootImage boots the image once with a plain QEMU command line (TCG, direct
// kernel boot, on a throwaway overlay) until the kernel has mounted the root
// filesystem and systemd has started, then stops it.
func bootImage(t *testing.T, ctx context.Context, img *Image) {
	testutil.Need(t, runtime.GOARCH == "amd64", "the boot check uses qemu-system-x86_64")
	testutil.Program(t, "qemu-system-x86_64")
	dir := t.TempDir()
	ov := filepath.Join(dir, "boot.qcow2")
	if err := CreateOverlay(ctx, execx.OS{}, img.Disk, img.Format, ov, 0); err != nil {
		t.Fatal(err)
	}
	console := filepath.Join(dir, "console.log")
	args := []string{
		"-name", "agent-vm-image-test", "-nodefaults", "-no-user-config", "-no-reboot",
		"-accel", "tcg,tb-size=256", "-cpu", "max", "-smp", "2", "-m", "1024",
		"-kernel", img.Kernel, "-initrd", img.Initrd, "-append", img.Cmdline,
		"-drive", "file=" + ov + ",if=virtio,format=qcow2",
		"-display", "none", "-serial", "file:" + console,
	}
	bootCtx, stop := context.WithTimeout(ctx, 5*time.Minute)
	defer stop()
	exited := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := execx.OS{}.Run(bootCtx, execx.Cmd{Path: "qemu-system-x86_64", Args: args})
		exited <- err
	}()
	defer func() { stop(); <-exited }()

	markers := []string{"EXT4-fs (vda): mounted filesystem", "systemd[1]: systemd ", "Welcome to"}
	seen := map[string]time.Duration{}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for len(seen) < len(markers) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("qemu exited before the guest booted: %v\nconsole tail:\n%s", err, consoleTail(console))
		case <-bootCtx.Done():
			t.Fatalf("no %q on the console within 5 minutes\nconsole tail:\n%s", missing(markers, seen), consoleTail(console))
		case <-tick.C:
		}
		log, _ := os.ReadFile(console)
		for _, m := range markers {
			if _, ok := seen[m]; !ok && bytes.Contains(log, []byte(m)) {
				seen[m] = time.Since(start)
			}
		}
	}
	t.Logf("root mounted after %s, systemd started after %s (wall clock, TCG)",
		seen[markers[0]].Round(100*time.Millisecond), seen[markers[1]].Round(100*time.Millisecond))
	if log, _ := os.ReadFile(console); bytes.Contains(log, []byte("Kernel panic")) || bytes.Contains(log, []byte("emergency mode")) {
		t.Errorf("the guest is in trouble:\n%s", consoleTail(console))
	}
}

func missing(markers []string, seen map[string]time.Duration) string {
	for _, m := range markers {
		if _, ok := seen[m]; !ok {
			return m
		}
	}
	return ""
}

func consoleTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return execx.TailLines(string(b), 40)
}

// testLogWriter sends progress lines to the test log.
type testLogWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.t.Log(strings.TrimRight(string(w.buf[:i]), "\r"))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}
