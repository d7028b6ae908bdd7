package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/execx"
)

// CreateOverlay creates overlayPath, a qcow2 image backed by base, so a VM
// writes only its own changes: `qemu-img create -f qcow2 -F <format> -b
// <absolute base> <overlay> [size]`.
//
// baseFormat is base's format ("qcow2" or "raw"); empty means detect it. It
// must match what base really is, since QEMU would otherwise misread the
// disk. sizeBytes is the overlay's virtual size: 0 keeps base's, a larger
// multiple of 512 grows the disk (cloud-init then grows the root
// filesystem), a smaller one is refused. The overlay is created under a
// temporary name and linked into place, so an existing file is never
// overwritten and a failure leaves nothing at overlayPath. The overlay is
// private to the user (0600): it will hold the VM's data.
func CreateOverlay(ctx context.Context, r execx.Runner, base, baseFormat, overlayPath string, sizeBytes int64) error {
	if overlayPath == "" {
		return errors.New("no overlay path given")
	}
	ov, err := filepath.Abs(overlayPath)
	if err != nil {
		return fmt.Errorf("overlay %q: %w", overlayPath, err)
	}
	if _, err := os.Lstat(ov); err == nil {
		return fmt.Errorf("overlay %s already exists; refusing to overwrite it (hint: it may hold a VM's disk: remove that VM first, or choose another path)", ov)
	}
	if fi, err := os.Stat(filepath.Dir(ov)); err != nil || !fi.IsDir() {
		return fmt.Errorf("overlay %s: directory %s does not exist", ov, filepath.Dir(ov))
	}
	d, err := Inspect(ctx, r, base)
	if err != nil {
		return fmt.Errorf("overlay base: %w", err)
	}
	if baseFormat == "" {
		baseFormat = d.Format
	}
	if baseFormat != d.Format {
		return fmt.Errorf("overlay base %s is %s, not %s (hint: pass its real format, or leave the format empty to detect it)", d.Path, d.Format, baseFormat)
	}
	size := d.VirtualSize
	if sizeBytes != 0 {
		if sizeBytes < d.VirtualSize {
			return fmt.Errorf("overlay size %d bytes (%s) is smaller than the base image's %d bytes (%s) (hint: give at least the base's size, or 0 to keep it)",
				sizeBytes, formatBytes(sizeBytes), d.VirtualSize, formatBytes(d.VirtualSize))
		}
		if sizeBytes%512 != 0 {
			return fmt.Errorf("overlay size %d bytes is not a multiple of 512 (hint: use a size in MiB or GiB, e.g. 8G)", sizeBytes)
		}
		size = sizeBytes
	}

	tmp := filepath.Join(filepath.Dir(ov), "."+filepath.Base(ov)+".tmp-"+randomHex(4))
	defer os.Remove(tmp) // after a successful link it only drops the temporary name
	args := []string{"create", "-q", "-f", "qcow2", "-F", baseFormat, "-b", d.Path, tmp, strconv.FormatInt(size, 10)}
	if _, err := r.Run(ctx, execx.Cmd{Path: "qemu-img", Args: args}); err != nil {
		return fmt.Errorf("creating overlay %s: %w", ov, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fmt.Errorf("creating overlay %s: %w", ov, err)
	}
	got, err := qemuImgInfo(ctx, r, tmp)
	if err != nil {
		return fmt.Errorf("checking overlay %s: %w", ov, err)
	}
	if got.Format != "qcow2" || got.VirtualSize != size || got.Backing != d.Path {
		return fmt.Errorf("qemu-img made overlay %s as %s of %d bytes on %q, want qcow2 of %d bytes on %q",
			ov, got.Format, got.VirtualSize, got.Backing, size, d.Path)
	}
	if err := syncFile(tmp); err != nil {
		return fmt.Errorf("creating overlay %s: %w", ov, err)
	}
	if err := os.Link(tmp, ov); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("overlay %s already exists; refusing to overwrite it (hint: it may hold a VM's disk: remove that VM first, or choose another path)", ov)
		}
		return fmt.Errorf("creating overlay %s: %w", ov, err)
	}
	return atomicfile.SyncDir(filepath.Dir(ov))
}
