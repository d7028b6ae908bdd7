package cloudinit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// The real cloud-init validates what we render, but installing Debian's
// cloud-init on a host enables its services there. So the tests run
// cloud-init inside a Debian root filesystem with chroot: the base image's
// (agent-vm's own guest, with the guest's cloud-init) where setup has built
// it, as README's test line does, copied out in seconds; else a small one
// mmdebstrap builds, once (minutes, more on a slow mirror).
const (
	rootfsRelease = "bookworm"
	defaultMirror = "http://deb.debian.org/debian"
)

// rootfsArgs is the mmdebstrap recipe. systemd is there for the
// systemd-network user that cloud-init's networkd renderer chowns files to.
func rootfsArgs(dir, mirror string) []string {
	return []string{
		"--mode=root", "--variant=apt", "--format=directory",
		"--include=cloud-init,systemd",
		`--aptopt=APT::Install-Recommends "false"`,
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		rootfsRelease, dir, mirror,
	}
}

// cloudInitRootfs returns the cached root filesystem, made the first time:
// copied out of the base image when there is one, else built with
// mmdebstrap. The cache lives in
// $XDG_CACHE_HOME/agent-vm/test/cloud-init-rootfs/, as image-<the disk's
// sha256> or <release>-<recipe hash>, is made in a temporary directory and
// renamed into place, and concurrent test processes wait for each other on
// a lock file.
func cloudInitRootfs(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "validating with the real cloud-init needs root (mmdebstrap --mode=root, chroot)")
	}
	testutil.Program(t, "chroot")
	mirror := os.Getenv("AGENT_VM_TEST_DEBIAN_MIRROR")
	if mirror == "" {
		mirror = defaultMirror
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatalf("no cache directory: %v", err)
	}
	base := filepath.Join(cache, "agent-vm", "test", "cloud-init-rootfs")
	if img := baseImage(); img != nil {
		final := filepath.Join(base, "image-"+img.Manifest.SHA256[:12])
		err := cachedRootfs(t, final, func(ctx context.Context, tmp string) error {
			t.Logf("copying the root filesystem of the base image %s to %s (once)", img.Dir, final)
			return copyImageRoot(ctx, t, img, tmp)
		})
		if err == nil {
			// Copies of an older image's tree (1.4 GB each) go.
			old, _ := filepath.Glob(filepath.Join(base, "image-*"))
			for _, o := range old {
				if o != final && !strings.HasSuffix(o, ".lock") {
					_ = os.RemoveAll(o)
				}
			}
			return final
		}
		t.Logf("copying the base image's root filesystem failed, so mmdebstrap builds one: %v", err)
	}
	sum := sha256.Sum256([]byte(strings.Join(rootfsArgs("", mirror), "\x00")))
	final := filepath.Join(base, rootfsRelease+"-"+hex.EncodeToString(sum[:])[:12])
	err = cachedRootfs(t, final, func(ctx context.Context, tmp string) error {
		mmdebstrap := testutil.Program(t, "mmdebstrap")
		t.Logf("building the cloud-init root filesystem in %s (once; minutes)", final)
		_, err := (execx.OS{}).Run(ctx, execx.Cmd{Path: mmdebstrap, Args: rootfsArgs(tmp, mirror)})
		return err
	})
	if err != nil {
		t.Fatalf("building the cloud-init root filesystem: %v", err)
	}
	return final
}

// cachedRootfs makes the root filesystem final with build, in final.tmp
// renamed into place, unless it is there; processes wait for each other
// on final.lock.
func cachedRootfs(t testing.TB, final string, build func(ctx context.Context, tmp string) error) error {
	t.Helper()
	ready := func() bool {
		_, err := os.Stat(filepath.Join(final, "usr", "bin", "cloud-init"))
		return err == nil
	}
	if ready() {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(final+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck
	if ready() {
		return nil // another test process made it while we waited
	}
	tmp := final + ".tmp"
	if err := os.RemoveAll(tmp); err != nil { // one that was interrupted
		return err
	}
	start := time.Now()
	if err := build(testutil.Context(t, "the cloud-init root filesystem's build"), tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	t.Logf("made the cloud-init root filesystem in %s", time.Since(start).Round(time.Second))
	return nil
}

// baseImage is the base image setup builds, in this user's image cache, or
// nil when there is none.
func baseImage() *image.Image {
	cache, err := image.DefaultCacheDir()
	if err != nil {
		return nil
	}
	img, err := image.Lookup(cache, image.DefaultBuildName)
	if err != nil || img.Manifest.Kind != image.KindBuilt || len(img.Manifest.SHA256) < 12 {
		return nil
	}
	return img
}

// copyImageRoot copies the root filesystem of img's disk (a whole-disk
// ext4) into dir: the disk converted to a raw file beside dir, mounted
// read-only on a loop device in a mount namespace of its own (gone with
// it, and the loop device with the mount), and copied with cp -a.
func copyImageRoot(ctx context.Context, t testing.TB, img *image.Image, dir string) error {
	raw, mnt := dir+".raw", dir+".mnt"
	defer os.Remove(raw)
	defer os.Remove(mnt)
	if _, err := (execx.OS{}).Run(ctx, execx.Cmd{Path: testutil.Program(t, "qemu-img"),
		Args: []string{"convert", "-f", img.Format, "-O", "raw", img.Disk, raw}}); err != nil {
		return err
	}
	_, err := (execx.OS{}).Run(ctx, execx.Cmd{Path: testutil.Program(t, "unshare"), Args: []string{
		"--mount", "--propagation", "private", "--", testutil.Program(t, "sh"), "-c",
		`mkdir "$1" "$2" && mount -o loop,ro "$0" "$1" && cp -a "$1"/. "$2"/`, raw, mnt, dir}})
	return err
}

// schemaResult is what `cloud-init schema` said about one user-data.
type schemaResult struct {
	valid  bool
	output string // stdout and stderr
}

// cloudInitSchema runs the real `cloud-init schema` on userData inside rootfs.
func cloudInitSchema(t testing.TB, rootfs string, userData []byte) schemaResult {
	t.Helper()
	f, err := os.CreateTemp(filepath.Join(rootfs, "tmp"), "user-data-*")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(userData); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	inside := "/tmp/" + filepath.Base(f.Name())
	res, err := execx.OS{}.Run(context.Background(), execx.Cmd{
		Path: "chroot", Args: []string{rootfs, "cloud-init", "schema", "--config-file", inside},
	})
	out := string(res.Stdout) + string(res.Stderr)
	var e *execx.Error
	switch {
	case err == nil:
		return schemaResult{valid: true, output: out}
	case errors.As(err, &e) && e.ExitCode == 1:
		return schemaResult{valid: false, output: out}
	default:
		t.Fatalf("running cloud-init schema: %v", err)
		return schemaResult{}
	}
}

// inRootfs runs a program inside rootfs and returns its combined output.
func inRootfs(t testing.TB, rootfs string, args ...string) string {
	t.Helper()
	res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: "chroot", Args: append([]string{rootfs}, args...)})
	if err != nil {
		t.Fatalf("%v", err)
	}
	return fmt.Sprintf("%s%s", res.Stdout, res.Stderr)
}
