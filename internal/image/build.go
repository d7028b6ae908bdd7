package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
)

// Defaults for Build.
const (
	DefaultRelease        = "bookworm"
	DefaultMirror         = "http://deb.debian.org/debian"
	DefaultSecurityMirror = "http://deb.debian.org/debian-security"
	DefaultSizeBytes      = 4 << 30
	// DefaultBuildName is the cache name of the image Build makes by default.
	DefaultBuildName = "debian-" + DefaultRelease
	minSizeBytes     = 1 << 30
)

// BuildOptions configures Build. Only Runner is required.
type BuildOptions struct {
	// Name is the cache entry; default "debian-<release>".
	Name string
	// Release is the Debian codename; default "bookworm".
	Release string
	// Mirror is the Debian archive; default DefaultMirror. The -updates suite
	// comes from it too.
	Mirror string
	// SecurityMirror carries <release>-security. Default: Mirror with its
	// trailing "/debian" replaced by "/debian-security" (right for
	// deb.debian.org and most mirrors and proxies), else
	// DefaultSecurityMirror.
	SecurityMirror string
	// Cache is the image cache root and the directories above it that
	// are agent-vm's, with their modes (hostdir.Table.Images); required.
	Cache *hostdir.Dir
	// SizeBytes is the disk's virtual size, a multiple of 1 MiB; default 4 GiB.
	SizeBytes int64
	// Force builds a new version even when a current one is cached. Existing
	// VMs keep the version their overlay was made on.
	Force bool

	Runner   execx.Runner     // runs mmdebstrap, mkfs.ext4, qemu-img, chroot
	Progress io.Writer        // phase lines and mmdebstrap's output; nil discards
	Logger   hclog.Logger     // nil: no logging
	Now      func() time.Time // nil: time.Now
}

// Build returns the cached image for opts, building it first when it is not
// cached yet (or Force is set). The build happens in a work directory inside
// the cache and is published by rename, so a failed or interrupted build
// leaves no image behind; a concurrent Build of the same name waits for the
// first and reuses its result. Building needs root (mmdebstrap's root mode).
func Build(ctx context.Context, opts BuildOptions) (*Image, error) {
	b, err := newBuilder(opts)
	if err != nil {
		return nil, err
	}
	return b.run(ctx)
}

type builder struct {
	opts    BuildOptions
	arch    debianArch
	log     hclog.Logger
	out     io.Writer
	now     func() time.Time
	geteuid func() int
}

func newBuilder(opts BuildOptions) (*builder, error) {
	if opts.Runner == nil {
		return nil, errors.New("image build: no runner")
	}
	if opts.Release == "" {
		opts.Release = DefaultRelease
	}
	if !isCodename(opts.Release) {
		return nil, fmt.Errorf("invalid Debian release %q (hint: use a codename such as bookworm)", opts.Release)
	}
	if opts.Name == "" {
		opts.Name = "debian-" + opts.Release
	}
	if err := validName(opts.Name); err != nil {
		return nil, err
	}
	if opts.Mirror == "" {
		opts.Mirror = DefaultMirror
	}
	opts.Mirror = strings.TrimRight(opts.Mirror, "/")
	if err := checkMirrorURL(opts.Mirror); err != nil {
		return nil, err
	}
	if opts.SecurityMirror == "" {
		opts.SecurityMirror = DefaultSecurityMirror
		if strings.HasSuffix(opts.Mirror, "/debian") {
			opts.SecurityMirror = opts.Mirror + "-security"
		}
	}
	opts.SecurityMirror = strings.TrimRight(opts.SecurityMirror, "/")
	if err := checkMirrorURL(opts.SecurityMirror); err != nil {
		return nil, err
	}
	if opts.SizeBytes == 0 {
		opts.SizeBytes = DefaultSizeBytes
	}
	if opts.SizeBytes < minSizeBytes || opts.SizeBytes%(1<<20) != 0 {
		return nil, fmt.Errorf("invalid image size %d bytes (hint: use a whole number of MiB, at least 1 GiB, e.g. 4G)", opts.SizeBytes)
	}
	if opts.Cache == nil {
		return nil, errNoCache
	}
	arch, err := debianArchFor(runtime.GOARCH)
	if err != nil {
		return nil, err
	}
	b := &builder{opts: opts, arch: arch, log: opts.Logger, out: opts.Progress, now: opts.Now, geteuid: os.Geteuid}
	if b.log == nil {
		b.log = hclog.NewNullLogger()
	}
	b.log = b.log.Named("image").With("image", opts.Name)
	if b.out == nil {
		b.out = io.Discard
	}
	if b.now == nil {
		b.now = time.Now
	}
	return b, nil
}

// preflight checks what Build needs before it takes any lock or space.
func (b *builder) preflight() error {
	var errs []error
	if b.geteuid() != 0 {
		errs = append(errs, errors.New("building an image needs root: mmdebstrap's root mode chroots, creates device nodes and sets file ownership "+
			"(hint: run it with sudo and keep your cache: `sudo agent-vm image build --cache-dir ~/.cache/agent-vm/images`, "+
			"or use a ready-made cloud image: `agent-vm image pull debian-12`)"))
	}
	if missing := (hostpkgs.Host{Run: b.opts.Runner}).Missing(hostpkgs.For(hostpkgs.Image)); len(missing) > 0 {
		errs = append(errs, fmt.Errorf("building an image needs %s, not found (hint: `sudo agent-vm setup` installs them; on Debian: apt-get install %s)",
			hostpkgs.Names(missing), strings.Join(hostpkgs.DebianPackages(missing), " ")))
	}
	return errors.Join(errs...)
}

func (b *builder) run(ctx context.Context) (*Image, error) {
	if err := b.preflight(); err != nil {
		return nil, err
	}
	start := b.now()
	st, err := openStore(b.opts.Cache, b.geteuid())
	if err != nil {
		return nil, err
	}
	unlock, err := st.lock(ctx, b.opts.Name, b.out)
	if err != nil {
		return nil, err
	}
	defer unlock()

	if img, ok := b.reusable(st, start); ok {
		fmt.Fprintf(b.out, "==> using cached image %s (built %s)\n", img.Name, img.Manifest.Created.Local().Format(time.DateTime))
		return img, nil
	}
	if err := st.sweep(b.opts.Name); err != nil {
		return nil, err
	}
	if err := checkFreeSpace(st.root, buildFreeSpace); err != nil {
		return nil, err
	}
	buildStart := b.now()
	work, err := st.tempDir(b.opts.Name)
	if err != nil {
		return nil, err
	}
	published := false
	defer func() {
		if !published {
			if err := removeTree(work); err != nil {
				b.log.Warn("could not remove the work directory", "dir", work, "error", err)
			}
		}
	}()
	m, err := b.make(ctx, work)
	if err != nil {
		return nil, err
	}
	m.BuildSeconds = b.now().Sub(buildStart).Round(100 * time.Millisecond).Seconds()
	if err := writeManifest(filepath.Join(work, ManifestFile), m); err != nil {
		return nil, err
	}
	dir, err := st.publish(b.opts.Name, work, m.Created)
	if err != nil {
		return nil, err
	}
	published = true
	img, err := load(b.opts.Name, dir)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(b.out, "==> built %s in %s: %s (%s qcow2, %s virtual)\n", img.Name,
		time.Duration(m.BuildSeconds*float64(time.Second)).Round(time.Second), img.Disk,
		formatBytes(m.SizeBytes), formatBytes(m.VirtualSizeBytes))
	return img, nil
}

// reusable returns the cached image when Build may hand it out instead of
// building: it is current (same recipe, release and architecture) and either
// Force is off or another process finished it while we waited for the lock.
func (b *builder) reusable(st *store, start time.Time) (*Image, bool) {
	img, err := Lookup(st.root, b.opts.Name)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			fmt.Fprintf(b.out, "==> rebuilding: %v\n", err)
		}
		return nil, false
	}
	m := img.Manifest
	if m.Kind != KindBuilt || m.BuilderVersion != BuilderVersion || m.Release != b.opts.Release || m.Arch != b.arch.deb {
		fmt.Fprintf(b.out, "==> cached %s is %s by builder %q for %s/%s; building a current one\n",
			img.Name, m.Kind, m.BuilderVersion, m.Release, m.Arch)
		return nil, false
	}
	if b.opts.Force && m.Created.Before(start) {
		return nil, false
	}
	return img, true
}

// make builds the image's files into work and returns their manifest.
func (b *builder) make(ctx context.Context, work string) (*Manifest, error) {
	rootfs := filepath.Join(work, "rootfs")
	if err := b.mmdebstrap(ctx, work, rootfs); err != nil {
		return nil, err
	}
	fmt.Fprintln(b.out, "==> checking the root filesystem")
	m, err := b.checkRootfs(ctx, rootfs)
	if err != nil {
		return nil, err
	}
	if err := copyFile(filepath.Join(rootfs, "boot", "vmlinuz-"+m.KernelVersion), filepath.Join(work, KernelFile), 0o644); err != nil {
		return nil, fmt.Errorf("copying the kernel: %w", err)
	}
	if err := copyFile(filepath.Join(rootfs, "boot", "initrd.img-"+m.KernelVersion), filepath.Join(work, InitrdFile), 0o644); err != nil {
		return nil, fmt.Errorf("copying the initrd: %w", err)
	}
	raw := filepath.Join(work, "disk.raw")
	if err := b.mkfs(ctx, rootfs, raw); err != nil {
		return nil, err
	}
	if err := removeTree(rootfs); err != nil {
		return nil, fmt.Errorf("removing the root filesystem tree: %w", err)
	}
	disk := filepath.Join(work, "disk.qcow2")
	fmt.Fprintln(b.out, "==> converting to qcow2")
	if _, err := b.opts.Runner.Run(ctx, execx.Cmd{Path: "qemu-img", Args: []string{"convert", "-f", "raw", "-O", "qcow2", raw, disk}}); err != nil {
		return nil, fmt.Errorf("converting the disk to qcow2: %w", err)
	}
	if err := os.Remove(raw); err != nil {
		return nil, err
	}
	if err := b.describeDisk(ctx, disk, m); err != nil {
		return nil, err
	}
	return m, nil
}

func (b *builder) mmdebstrap(ctx context.Context, work, rootfs string) error {
	hooks := filepath.Join(work, "hooks")
	if err := os.Mkdir(hooks, 0o755); err != nil {
		return err
	}
	if err := writeGuestFiles(hooks); err != nil {
		return err
	}
	args := mmdebstrapArgs(b.opts, b.arch, hooks, rootfs)
	fmt.Fprintf(b.out, "==> building a Debian %s root filesystem with mmdebstrap from %s (about 2 minutes)\n", b.opts.Release, b.opts.Mirror)
	b.log.Debug("running mmdebstrap", "args", args)
	// In a private mount namespace, mmdebstrap's /proc, /sys and /dev mounts
	// in the rootfs vanish with it, even when it is killed on cancellation.
	cmd := execx.Cmd{Path: "unshare", Args: append([]string{"--mount", "--propagation", "private", "--", "mmdebstrap"}, args...),
		Stdout: b.out, Stderr: b.out}
	if _, err := b.opts.Runner.Run(ctx, cmd); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("building the root filesystem: %w", ctx.Err())
		}
		// Its whole output went to the progress writer; the error keeps the end.
		var xe *execx.Error
		if errors.As(err, &xe) && xe.Stderr != "" {
			err = fmt.Errorf("%w: %s", xe.Err, execx.TailLines(xe.Stderr, 5))
		}
		return fmt.Errorf("building the root filesystem with mmdebstrap failed (hint: check that %s is reachable; the full output is above): %w", b.opts.Mirror, err)
	}
	return os.RemoveAll(hooks)
}

// writeGuestFiles writes guestFiles into dir, flat.
func writeGuestFiles(dir string) error {
	entries, err := guestFiles.ReadDir("guest")
	if err != nil {
		return fmt.Errorf("internal error: embedded guest files: %w", err)
	}
	for _, e := range entries {
		body, err := guestFiles.ReadFile("guest/" + e.Name())
		if err != nil {
			return fmt.Errorf("internal error: embedded guest files: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), body, 0o755); err != nil {
			return err
		}
	}
	return nil
}

func (b *builder) mkfs(ctx context.Context, rootfs, raw string) error {
	used, err := treeUsage(rootfs)
	if err != nil {
		return fmt.Errorf("measuring the root filesystem: %w", err)
	}
	if limit := b.opts.SizeBytes / 100 * 85; used > limit {
		return fmt.Errorf("the root filesystem needs about %s, too much for a %s disk (hint: pass a larger size, e.g. --size %dG)",
			formatBytes(used), formatBytes(b.opts.SizeBytes), (used*100/85)>>30+2)
	}
	fmt.Fprintf(b.out, "==> making a %s ext4 filesystem from the tree (%s used)\n", formatBytes(b.opts.SizeBytes), formatBytes(used))
	f, err := os.Create(raw)
	if err != nil {
		return err
	}
	if err := f.Truncate(b.opts.SizeBytes); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// -d fills the filesystem from the directory: no loop mount needed.
	args := []string{"-q", "-F", "-L", "agent-vm-root", "-d", rootfs, raw}
	if _, err := b.opts.Runner.Run(ctx, execx.Cmd{Path: "mkfs.ext4", Args: args}); err != nil {
		return fmt.Errorf("making the ext4 filesystem: %w", err)
	}
	return nil
}

// describeDisk fills in the manifest's disk fields from the finished qcow2.
func (b *builder) describeDisk(ctx context.Context, disk string, m *Manifest) error {
	info, err := qemuImgInfo(ctx, b.opts.Runner, disk)
	if err != nil {
		return err
	}
	if info.Format != "qcow2" || info.VirtualSize != b.opts.SizeBytes {
		return fmt.Errorf("qemu-img made a %s disk of %d bytes, want qcow2 of %d", info.Format, info.VirtualSize, b.opts.SizeBytes)
	}
	fmt.Fprintln(b.out, "==> checksumming the disk")
	sums, err := hashFile(disk, "sha256")
	if err != nil {
		return err
	}
	if err := syncFile(disk); err != nil {
		return err
	}
	fi, err := os.Stat(disk)
	if err != nil {
		return err
	}
	m.Disk, m.Format, m.SizeBytes, m.VirtualSizeBytes, m.SHA256 = filepath.Base(disk), info.Format, fi.Size(), info.VirtualSize, sums["sha256"]
	return nil
}

// buildFreeSpace is the free space a build needs in the cache: at its peak
// it holds the root filesystem tree and the raw image (about 1.1 GiB each),
// then the raw image and the qcow2; plus a margin.
const buildFreeSpace = 3 << 30

// checkFreeSpace fails early, with a clear message, when dir's filesystem has
// less than need bytes available.
func checkFreeSpace(dir string, need int64) error {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return nil // unknown: let the build try
	}
	if avail := int64(fs.Bavail) * fs.Bsize; avail < need {
		return fmt.Errorf("building an image needs about %s free in %s, only %s is available (hint: free some space, or pass a cache directory on a larger disk)",
			formatBytes(need), dir, formatBytes(avail))
	}
	return nil
}

func isCodename(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if r < 'a' || r > 'z' {
			return false
		}
	}
	return true
}

func checkMirrorURL(u string) error {
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "file://") ||
		strings.ContainsAny(u, " \t\n\"'") {
		return fmt.Errorf("invalid mirror URL %q (hint: use an http(s) URL such as %s)", u, DefaultMirror)
	}
	return nil
}
