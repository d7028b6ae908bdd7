package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

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

// CopyOverlay copies the qcow2 overlay from (a VM's disk, which no one
// writes meanwhile: its VM stopped or its CPUs paused, QEMU having flushed
// it) to to, which must not exist: the same bytes on the same backing file,
// a disk of its own from here (its holes stay holes, nothing is linked to
// from's blocks). It is made under a temporary name, checked with qemu-img,
// synced (when sync) and linked into place (0600), so a failure (a full
// disk, an interrupt) leaves nothing at to. A caller that copies more
// than the disk, and writes it all out at once before it counts on it
// (atomicfile.SyncFS), does not sync: a sync here would hold the source
// still the longer. It returns the bytes copied.
func CopyOverlay(ctx context.Context, r execx.Runner, from, to string, sync bool) (int64, error) {
	if _, err := os.Lstat(to); err == nil {
		return 0, fmt.Errorf("disk %s already exists; refusing to overwrite it", to)
	}
	want, err := qemuImgInfo(ctx, r, from, "-U")
	if err != nil {
		return 0, fmt.Errorf("reading the disk %s: %w", from, err)
	}
	if want.Format != "qcow2" {
		return 0, fmt.Errorf("the disk %s is %s, not a qcow2 overlay", from, want.Format)
	}
	tmp := filepath.Join(filepath.Dir(to), "."+filepath.Base(to)+".tmp-"+randomHex(4))
	defer os.Remove(tmp) // after a successful link it only drops the temporary name
	n, err := copySparse(ctx, from, tmp, sync)
	if err != nil {
		return 0, fmt.Errorf("copying the disk %s to %s: %w", from, to, err)
	}
	got, err := qemuImgInfo(ctx, r, tmp)
	if err != nil {
		return 0, fmt.Errorf("checking the copy of %s: %w", from, err)
	}
	if got.Format != want.Format || got.VirtualSize != want.VirtualSize || got.Backing != want.Backing {
		return 0, fmt.Errorf("the copy of %s reads as %s of %d bytes on %q, not %s of %d bytes on %q", from,
			got.Format, got.VirtualSize, got.Backing, want.Format, want.VirtualSize, want.Backing)
	}
	if err := os.Link(tmp, to); err != nil {
		return 0, fmt.Errorf("copying the disk %s to %s: %w", from, to, err)
	}
	if !sync {
		return n, nil
	}
	return n, atomicfile.SyncDir(filepath.Dir(to))
}

// copySparse copies the regular file from to to (made 0600, O_EXCL) range
// by range of data, so that holes are not written, and syncs it (when
// sync); it returns the data bytes copied.
func copySparse(ctx context.Context, from, to string, sync bool) (int64, error) {
	in, err := os.Open(from)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return 0, err
	}
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	var copied int64
	size := fi.Size()
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return 0, err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return 0, err
		}
		// At most 64 MiB at a time, so an interrupt is heard.
		end := min(hole, data+64<<20)
		w, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, end-data))
		if err != nil {
			return 0, err
		}
		copied += w
		off = end
	}
	if err := out.Truncate(size); err != nil {
		return 0, err
	}
	if sync {
		if err := out.Sync(); err != nil {
			return 0, err
		}
	}
	return copied, out.Close()
}
