// Package image provides the base disk images agent-vm boots its VMs from.
//
// Three sources feed the same cache:
//
//   - Build makes a Debian image from Debian packages with mmdebstrap, plus the
//     kernel and initrd for direct kernel boot.
//   - Pull downloads an official generic cloud image (Debian, Ubuntu) and
//     verifies it against the distribution's checksum list.
//   - Inspect and CreateOverlay handle a disk image the user names with
//     --image, and the per-VM qcow2 overlay on top of any base.
//
// The cache (default $XDG_CACHE_HOME/agent-vm/images) holds one entry per
// image name. `<cache>/<name>` is a symlink to an immutable version directory
// under `<cache>/.store/<name>/`; a rebuild or re-pull writes a new version and
// swings the symlink, so overlays of existing VMs, which name the version's
// disk by absolute path, keep the exact base they were created on.
//
// Programs (mmdebstrap, mkfs.ext4, qemu-img) run only through an
// execx.Runner.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// BuilderVersion identifies the recipe Build uses. It is bumped whenever the
// guest contents or layout change, so a cached image built by an older recipe
// is rebuilt rather than reused.
const BuilderVersion = "6"

// manifestSchema is the version of the manifest's JSON layout.
const manifestSchema = 1

// File names inside an image's version directory.
const (
	ManifestFile = "manifest.json"
	KernelFile   = "vmlinuz"
	InitrdFile   = "initrd.img"
)

// Kinds of image, as recorded in the manifest.
const (
	KindBuilt  = "built"  // made by Build with mmdebstrap
	KindPulled = "pulled" // downloaded by Pull
)

// ErrNotFound is returned (wrapped) by Lookup when the cache has no image of
// that name.
var ErrNotFound = errors.New("image not found")

// Image is a complete image in the cache.
type Image struct {
	Name string
	// Dir is the image's immutable version directory (symlinks resolved).
	Dir string
	// Disk is the absolute path of the disk image; Format is its format
	// ("qcow2"). Use Disk, not the <cache>/<name> symlink, as an overlay's
	// backing file.
	Disk   string
	Format string
	// Kernel and Initrd are absolute paths for direct kernel boot, and Cmdline
	// the kernel command line to go with them. All three are empty for images
	// that boot through their own bootloader (pulled cloud images).
	Kernel  string
	Initrd  string
	Cmdline string
	// Manifest is the image's manifest.json as read from Dir.
	Manifest Manifest
}

// Manifest describes an image; it is stored as manifest.json beside the disk.
type Manifest struct {
	Schema         int       `json:"schema"`
	Name           string    `json:"name"`
	Kind           string    `json:"kind"` // KindBuilt or KindPulled
	BuilderVersion string    `json:"builder_version"`
	Created        time.Time `json:"created"`
	Arch           string    `json:"arch"` // the distribution's name for it (amd64, arm64)

	Disk             string `json:"disk"`   // file name in the image directory
	Format           string `json:"format"` // qcow2
	SizeBytes        int64  `json:"size_bytes"`
	VirtualSizeBytes int64  `json:"virtual_size_bytes"`
	SHA256           string `json:"sha256"` // of the disk file, hex

	// Direct kernel boot (built images).
	Kernel        string `json:"kernel,omitempty"` // file name in the image directory
	Initrd        string `json:"initrd,omitempty"` // file name in the image directory
	KernelVersion string `json:"kernel_version,omitempty"`
	Cmdline       string `json:"cmdline,omitempty"`

	// Built images.
	Release        string    `json:"release,omitempty"`
	Mirror         string    `json:"mirror,omitempty"`
	SecurityMirror string    `json:"security_mirror,omitempty"`
	Sources        []string  `json:"sources,omitempty"` // the apt sources.list lines used
	BuildSeconds   float64   `json:"build_seconds,omitempty"`
	Modules        []string  `json:"modules,omitempty"` // kernel modules checked present
	Packages       []Package `json:"packages,omitempty"`

	// Pulled images.
	SourceURL    string `json:"source_url,omitempty"`
	ChecksumURL  string `json:"checksum_url,omitempty"`
	Checksum     string `json:"checksum,omitempty"` // "<algo>:<hex>" as published
	ETag         string `json:"etag,omitempty"`
	LastModified string `json:"last_modified,omitempty"`
}

// Package is one installed Debian package.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Arch    string `json:"arch"`
}

// DefaultCacheDir returns $XDG_CACHE_HOME/agent-vm/images (or
// ~/.cache/agent-vm/images), where hostdir.Table puts this user's image
// cache: for tests that use the host's base image. Builds and pulls are
// given the cache with its modes (BuildOptions.Cache).
func DefaultCacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding the cache directory: %w (hint: set XDG_CACHE_HOME or HOME)", err)
	}
	return filepath.Join(base, "agent-vm", "images"), nil
}

// Lookup returns the cached image called name, or an error wrapping
// ErrNotFound when there is none. An entry that is present but damaged (a
// missing file, an unreadable manifest) is an error that says so.
func Lookup(cacheDir, name string) (*Image, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	link := filepath.Join(cacheDir, name)
	dir, err := filepath.EvalSymlinks(link)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("image %q in %s: %w (hint: run `agent-vm image build` or `agent-vm image pull debian-12`)", name, cacheDir, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading image %q: %w", name, err)
	}
	return load(name, dir)
}

// List returns every image in the cache, sorted by name. Damaged entries are
// reported in the error, joined, beside the images that could be read.
func List(cacheDir string) ([]*Image, error) {
	entries, err := os.ReadDir(cacheDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	var imgs []*Image
	var errs []error
	for _, e := range entries {
		if e.Type()&fs.ModeSymlink == 0 || validName(e.Name()) != nil {
			continue
		}
		img, err := Lookup(cacheDir, e.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		imgs = append(imgs, img)
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].Name < imgs[j].Name })
	return imgs, errors.Join(errs...)
}

// Open reads the image version in dir (an Image's Dir), which a VM's disk
// was made on, whether or not it is still the image's current version.
func Open(dir string) (*Image, error) {
	if _, err := os.Stat(filepath.Join(dir, ManifestFile)); err != nil {
		return nil, err
	}
	return load(filepath.Base(filepath.Dir(dir)), dir)
}

// load reads the version directory dir and checks that the files its manifest
// names are there.
func load(name, dir string) (*Image, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, fmt.Errorf("image %q is damaged: %w (hint: rebuild or re-pull it)", name, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("image %q is damaged: %s: %w (hint: rebuild or re-pull it)", name, ManifestFile, err)
	}
	if m.Schema != manifestSchema {
		return nil, fmt.Errorf("image %q has manifest schema %d, this agent-vm reads %d (hint: rebuild or re-pull it)", name, m.Schema, manifestSchema)
	}
	img := &Image{Name: name, Dir: dir, Format: m.Format, Cmdline: m.Cmdline, Manifest: m}
	paths := []struct {
		field *string
		file  string
	}{{&img.Disk, m.Disk}, {&img.Kernel, m.Kernel}, {&img.Initrd, m.Initrd}}
	for _, p := range paths {
		if p.file == "" {
			continue
		}
		if filepath.Base(p.file) != p.file {
			return nil, fmt.Errorf("image %q is damaged: manifest names %q outside its directory (hint: rebuild or re-pull it)", name, p.file)
		}
		*p.field = filepath.Join(dir, p.file)
		if _, err := os.Stat(*p.field); err != nil {
			return nil, fmt.Errorf("image %q is damaged: %w (hint: rebuild or re-pull it)", name, err)
		}
	}
	if img.Disk == "" {
		return nil, fmt.Errorf("image %q is damaged: its manifest names no disk (hint: rebuild or re-pull it)", name)
	}
	return img, nil
}

// validName accepts the names the cache uses: a letter or digit, then letters,
// digits, '.', '_' and '-'.
func validName(name string) error {
	ok := name != "" && len(name) <= 64
	for i, r := range name {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || (r != '.' && r != '_' && r != '-')) {
			ok = false
			break
		}
	}
	if !ok {
		return fmt.Errorf("invalid image name %q (hint: use letters, digits, '.', '_' and '-', e.g. debian-bookworm)", name)
	}
	return nil
}

// Prune removes the versions of cached images that are no longer current
// (a rebuild or re-pull replaced them) and that inUse does not claim. inUse
// gets the absolute path of each such version's disk and must report
// whether any VM's overlay still has it as its backing file; when in doubt
// it must answer true, since removing a base destroys the VMs built on it.
// Prune returns the version directories it removed. It holds each name's
// lock while it looks, so a build or pull publishing meanwhile is safe.
func Prune(ctx context.Context, cache *hostdir.Dir, inUse func(disk string) bool) ([]string, error) {
	st, err := openStore(cache, os.Geteuid())
	if err != nil {
		return nil, fmt.Errorf("pruning images: %w", err)
	}
	cacheDir := st.root
	names, err := os.ReadDir(filepath.Join(cacheDir, storeDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pruning images: %w", err)
	}
	var removed []string
	var errs []error
	for _, n := range names {
		if validName(n.Name()) != nil {
			continue
		}
		r, err := pruneName(ctx, st, n.Name(), inUse)
		removed = append(removed, r...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

func pruneName(ctx context.Context, st *store, name string, inUse func(disk string) bool) ([]string, error) {
	unlock, err := st.lock(ctx, name, io.Discard)
	if err != nil {
		return nil, err
	}
	defer unlock()
	current, _ := filepath.EvalSymlinks(filepath.Join(st.root, name))
	versions, err := os.ReadDir(filepath.Join(st.root, storeDir, name))
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, v := range versions {
		dir := filepath.Join(st.root, storeDir, name, v.Name())
		if real, _ := filepath.EvalSymlinks(dir); (real == current && current != "") || versionInUse(dir, inUse) {
			continue
		}
		if err := removeTree(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// versionInUse asks inUse about every disk file in a version directory (all
// of them, so a version with a damaged manifest is not removed under a VM),
// and keeps any version an existing overlay was registered on (MarkUsed),
// wherever that overlay's VM lives.
func versionInUse(dir string, inUse func(disk string) bool) bool {
	disks, _ := filepath.Glob(filepath.Join(dir, "disk.*"))
	for _, d := range disks {
		if inUse(d) {
			return true
		}
	}
	return LiveUsers(dir) > 0
}

// LiveUsers counts the overlays recorded as made on a disk in dir
// (MarkUsed, MarkUser) that still exist, wherever their VMs live; a record
// that cannot be read counts, since in doubt a disk must be kept.
func LiveUsers(dir string) int {
	n := 0
	users, _ := filepath.Glob(filepath.Join(dir, UsersDir, "*"))
	for _, u := range users {
		b, err := os.ReadFile(u)
		if err != nil {
			n++
			continue
		}
		if _, err := os.Stat(strings.TrimSpace(string(b))); err == nil {
			n++
		}
	}
	return n
}

// UsersDir, in an image version's directory (or a template's), has one
// file per overlay made on that directory's disk, holding the overlay's
// path.
const UsersDir = ".users"

// MarkUsed records that overlay is based on disk (an image version's disk),
// so Prune keeps that version while the overlay exists, whichever state
// directory its VM lives in. Disks outside the cache are not recorded.
func MarkUsed(disk, overlay string) error {
	if _, err := os.Stat(filepath.Join(filepath.Dir(disk), ManifestFile)); err != nil {
		return nil // not a cached image version
	}
	return MarkUser(disk, overlay)
}

// MarkUser records that overlay is based on disk, in a directory of
// agent-vm's own that more than one state directory's VMs use (a
// template's, which LiveUsers then reads), so that the disk is kept while
// the overlay exists.
func MarkUser(disk, overlay string) error {
	dir := filepath.Dir(disk)
	abs, err := filepath.Abs(overlay)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, UsersDir), 0o755); err != nil {
		return fmt.Errorf("recording that %s uses %s: %w", overlay, disk, err)
	}
	sum := sha256.Sum256([]byte(abs))
	record := filepath.Join(dir, UsersDir, hex.EncodeToString(sum[:8]))
	if b, err := os.ReadFile(record); err == nil && string(b) == abs+"\n" {
		return nil // recorded already (the debian backend records at every start)
	}
	return atomicfile.Write(record, []byte(abs+"\n"), 0o644)
}
