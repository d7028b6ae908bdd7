package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// Disk describes a disk image file, as Inspect found it.
type Disk struct {
	Path        string // absolute
	Format      string // "qcow2" or "raw"
	VirtualSize int64  // bytes the guest sees
	// BackingFile is the absolute path of a qcow2 image's backing file, or
	// empty; BackingFormat is its format when recorded.
	BackingFile   string
	BackingFormat string
}

// qemuInfo is what `qemu-img info --output=json` says about one image.
type qemuInfo struct {
	Format        string
	VirtualSize   int64
	Backing       string // full-backing-filename (resolved), else backing-filename
	BackingFormat string
	Corrupt       bool
	Encrypted     bool
}

// qemuImgInfo runs qemu-img info on an absolute path, with flags (-U: read
// an image a running QEMU holds) before it.
func qemuImgInfo(ctx context.Context, r execx.Runner, path string, flags ...string) (*qemuInfo, error) {
	if _, err := r.LookPath("qemu-img"); err != nil {
		return nil, errors.New("qemu-img not found in PATH (hint: apt-get install qemu-utils)")
	}
	res, err := r.Run(ctx, execx.Cmd{Path: "qemu-img", Args: append(append([]string{"info", "--output=json"}, flags...), path)})
	if err != nil {
		var xe *execx.Error
		if errors.As(err, &xe) && strings.Contains(xe.Stderr, "lock") {
			return nil, fmt.Errorf("image %s is in use by a running QEMU (hint: stop the VM that uses it first): %w", path, err)
		}
		return nil, fmt.Errorf("%s is not a disk image qemu-img can read: %w", path, err)
	}
	out := res.Stdout
	if !gjson.ValidBytes(out) {
		return nil, fmt.Errorf("qemu-img info %s: unreadable output %q", path, execx.Tail(out, 200))
	}
	j := gjson.ParseBytes(out)
	info := &qemuInfo{
		Format:        j.Get("format").String(),
		VirtualSize:   j.Get("virtual-size").Int(),
		Backing:       j.Get("full-backing-filename").String(),
		BackingFormat: j.Get("backing-filename-format").String(),
		Corrupt:       j.Get("format-specific.data.corrupt").Bool(),
		Encrypted:     j.Get("encrypted").Bool(),
	}
	if info.Backing == "" {
		info.Backing = j.Get("backing-filename").String()
	}
	if info.Format == "" {
		return nil, fmt.Errorf("qemu-img info %s: no format in its output", path)
	}
	return info, nil
}

// Inspect checks that path is a disk image a VM can boot from (qcow2 or raw)
// and describes it. The errors name the path and, for the usual mistakes (a
// directory, an installer ISO, a compressed download, a kernel), what to do.
func Inspect(ctx context.Context, r execx.Runner, path string) (*Disk, error) {
	if path == "" {
		return nil, errors.New("no image path given")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", path, err)
	}
	fi, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("image %q does not exist (hint: check the path; `agent-vm image list` shows cached images, `agent-vm image pull debian-12` downloads one)", path)
	case err != nil:
		return nil, fmt.Errorf("image %q: %w", path, err)
	case fi.IsDir():
		return nil, fmt.Errorf("image %q is a directory, not a disk image (hint: pass the .qcow2, .img or .raw file inside it)", path)
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("image %q is not a regular file (%s); agent-vm boots VMs from disk image files only", path, fi.Mode().Type())
	}
	head, err := readHead(abs, 68<<10)
	if err != nil {
		return nil, fmt.Errorf("image %q cannot be read: %w (hint: check its permissions)", path, err)
	}
	info, err := qemuImgInfo(ctx, r, abs)
	if err != nil {
		return nil, err
	}
	d := &Disk{Path: abs, Format: info.Format, VirtualSize: info.VirtualSize,
		BackingFile: info.Backing, BackingFormat: info.BackingFormat}
	switch info.Format {
	case "qcow2":
		return d, checkQcow2(path, info)
	case "raw":
		if err := checkRaw(path, head, fi.Size()); err != nil {
			return nil, err
		}
		return d, nil
	}
	return nil, fmt.Errorf("image %q is in %s format; agent-vm uses qcow2 or raw (hint: convert it: qemu-img convert -O qcow2 %s %s)",
		path, info.Format, execx.ShellQuote(path), execx.ShellQuote(strings.TrimSuffix(path, filepath.Ext(path))+".qcow2"))
}

func checkQcow2(path string, info *qemuInfo) error {
	if info.Corrupt {
		return fmt.Errorf("image %q is marked corrupt by qemu (hint: try `qemu-img check -r all %s`, or use a fresh image)", path, execx.ShellQuote(path))
	}
	if info.Encrypted {
		return fmt.Errorf("image %q is encrypted; agent-vm cannot pass it a key (hint: use an unencrypted image)", path)
	}
	if info.Backing != "" {
		if _, err := os.Stat(info.Backing); err != nil {
			return fmt.Errorf("image %q is an overlay whose backing file %s is missing (hint: restore that file, or pass a standalone image)", path, info.Backing)
		}
	}
	return nil
}

// readHead reads up to n bytes from the start of a file.
func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	m, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:m], nil
}

// minRawSize is the smallest raw file taken for a disk image.
const minRawSize = 1 << 20

// checkRaw accepts a file qemu-img calls raw (as it calls anything it does
// not recognise) only when it looks like a disk: a partition table or a
// filesystem at the start. It names the usual mistakes.
func checkRaw(path string, head []byte, size int64) error {
	if what, hint := notADisk(head); what != "" {
		return fmt.Errorf("image %q is %s, not a disk image (hint: %s)", path, what, hint)
	}
	if size < minRawSize {
		return fmt.Errorf("image %q is only %d bytes, too small to be a disk image (hint: pass a qcow2 or raw cloud image, e.g. from `agent-vm image pull debian-12`)", path, size)
	}
	if !looksLikeDisk(head) {
		return fmt.Errorf("image %q has no partition table or filesystem that agent-vm recognises, so it does not look like a disk image (hint: pass a qcow2 or raw cloud image, e.g. from `agent-vm image pull debian-12`)", path)
	}
	return nil
}

// at reports whether b has magic at offset off.
func at(b []byte, off int, magic string) bool {
	return len(b) >= off+len(magic) && bytes.Equal(b[off:off+len(magic)], []byte(magic))
}

// notADisk recognises files people pass by mistake: what it is, and a hint.
func notADisk(h []byte) (what, hint string) {
	const unpack = "unpack it first (tar -xf, xz -d, gunzip, unzstd ...) and pass the disk image inside"
	const cloud = "use a cloud disk image, e.g. `agent-vm image pull debian-12`"
	switch {
	case at(h, 0x8001, "CD001"):
		return "an ISO 9660 CD/DVD image (an installer or a cloud-init seed?)", cloud
	case at(h, 0, "\x1f\x8b"):
		return "gzip-compressed", unpack
	case at(h, 0, "\xfd7zXZ\x00"):
		return "xz-compressed", unpack
	case at(h, 0, "\x28\xb5\x2f\xfd"):
		return "zstd-compressed", unpack
	case at(h, 0, "BZh"):
		return "bzip2-compressed", unpack
	case at(h, 0, "PK\x03\x04"):
		return "a zip archive", unpack
	case at(h, 0, "7z\xbc\xaf\x27\x1c"):
		return "a 7-zip archive", unpack
	case at(h, 257, "ustar"):
		return "a tar archive (an OVA or a packed image?)", unpack
	case at(h, 0, "070701"), at(h, 0, "070702"):
		return "a cpio archive (an initrd?)", cloud
	case at(h, 0x202, "HdrS"):
		return "a Linux kernel", cloud
	case at(h, 0, "\x7fELF"):
		return "an ELF executable", cloud
	case at(h, 0, "#!"):
		return "a script", cloud
	}
	return "", ""
}

// looksLikeDisk finds an MBR or GPT partition table, or a whole-disk
// filesystem, at the start of a raw image.
func looksLikeDisk(h []byte) bool {
	return at(h, 510, "\x55\xaa") || // MBR (and the protective MBR of GPT)
		at(h, 512, "EFI PART") || // GPT
		at(h, 1080, "\x53\xef") || // ext2/3/4 superblock magic
		at(h, 0, "XFSB") || // XFS
		at(h, 0x10040, "_BHRfS_M") // btrfs
}
