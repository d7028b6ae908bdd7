// Package iso9660 writes small ISO 9660 images: one flat root directory of
// regular files, with Rock Ridge names, modes and times.
//
// It exists to build the cloud-init NoCloud seed (volume id "cidata") without
// running genisoimage or xorriso: a seed holds a handful of files, so a writer
// for exactly that shape is a few hundred lines, where a general library
// (go-diskfs) is a large dependency.
//
// The image is ISO 9660 level 1 (8.3 names, the fallback every reader
// understands) plus Rock Ridge (RRIP 1.09, announced by SUSP SP and ER
// entries), which carries each file's real name (NM), POSIX mode, owner and
// link count (PX) and times (TF). Linux, libisofs (xorriso) and isoinfo read
// the Rock Ridge names. Output is deterministic: the same Volume gives the same
// bytes, with every timestamp taken from Volume.ModTime.
package iso9660

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
)

// SectorSize is the logical block size of every image this package writes.
const SectorSize = 2048

// MaxNameLen is the longest file name accepted: with its Rock Ridge entries a
// directory record must fit in 255 bytes.
const MaxNameLen = 128

// MaxFileSize is the largest file one directory record can describe.
const MaxFileSize = 1<<32 - 1

// DefaultMode is the mode a File with Mode 0 gets.
const DefaultMode fs.FileMode = 0o644

// File is one regular file in the image's root directory.
type File struct {
	// Name is the file's name as Linux sees it (Rock Ridge NM): 1 to
	// MaxNameLen bytes of letters, digits, '.', '-' and '_', not "." or "..".
	Name string
	// Mode holds the permission bits (Rock Ridge PX); 0 means DefaultMode.
	// Files are owned by uid 0, gid 0.
	Mode fs.FileMode
	// Data is the file's contents, used when SourcePath is empty.
	Data []byte
	// SourcePath, when set, names a file on disk whose contents are streamed
	// into the image. It must not change while the image is written.
	SourcePath string
}

// Volume describes a whole image.
type Volume struct {
	// ID is the volume identifier (the filesystem label blkid reports):
	// 1 to 32 letters, digits, '-' or '_'. cloud-init looks for "cidata".
	ID string
	// ModTime is written as every timestamp in the image (volume dates and
	// file times), so the same Volume always gives the same bytes. Required.
	ModTime time.Time
	// Files are placed in the root directory; their order does not matter.
	Files []File
}

// Write writes the image to path atomically: it is written to a temporary
// file in the same directory (mode 0600), synced and renamed into place, so
// path holds either the old contents or the complete new image.
func Write(ctx context.Context, path string, v Volume) error {
	err := atomicfile.WriteFrom(path, 0o600, func(w io.Writer) error {
		_, err := Encode(ctx, w, v)
		return err
	})
	if err != nil {
		return fmt.Errorf("writing iso image: %w", err)
	}
	return nil
}

// Encode writes the image to w and returns the number of bytes written.
func Encode(ctx context.Context, w io.Writer, v Volume) (int64, error) {
	l, err := plan(v)
	if err != nil {
		return 0, err
	}
	cw := &countingWriter{w: w}
	if _, err := cw.Write(l.header()); err != nil {
		return cw.n, err
	}
	for _, e := range l.entries {
		if err := ctx.Err(); err != nil {
			return cw.n, err
		}
		if err := writeContents(ctx, cw, e); err != nil {
			return cw.n, fmt.Errorf("file %q: %w", e.file.Name, err)
		}
		if pad := padding(e.size); pad > 0 {
			if _, err := cw.Write(make([]byte, pad)); err != nil {
				return cw.n, err
			}
		}
	}
	if want := int64(l.totalSectors) * SectorSize; cw.n != want {
		return cw.n, fmt.Errorf("internal error: wrote %d bytes, planned %d", cw.n, want)
	}
	return cw.n, nil
}

// entry is a File placed in the image.
type entry struct {
	file   File
	isoID  string // the ISO 9660 file identifier, e.g. "USER_DAT.;1"
	mode   fs.FileMode
	size   int64
	extent uint32 // first sector of the contents
}

// validate checks v and returns its files with sizes resolved, sorted by name.
func validate(v Volume) ([]entry, error) {
	var errs []error
	if err := validateVolumeID(v.ID); err != nil {
		errs = append(errs, err)
	}
	if v.ModTime.IsZero() {
		errs = append(errs, errors.New("volume time is not set (hint: pass a fixed time, such as the VM's creation time, so the image is reproducible)"))
	} else if y := v.ModTime.UTC().Year(); y < 1970 || y > 2155 {
		errs = append(errs, fmt.Errorf("volume time %s is outside the years ISO 9660 can record (1970-2155)", v.ModTime.UTC().Format(time.RFC3339)))
	}
	seen := map[string]bool{}
	entries := make([]entry, 0, len(v.Files))
	for _, f := range v.Files {
		if err := ValidName(f.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[f.Name] {
			errs = append(errs, fmt.Errorf("file name %q appears twice", f.Name))
			continue
		}
		seen[f.Name] = true
		e, err := resolve(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		entries = append(entries, e)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].file.Name < entries[j].file.Name })
	return entries, nil
}

func resolve(f File) (entry, error) {
	e := entry{file: f, mode: f.Mode}
	if e.mode == 0 {
		e.mode = DefaultMode
	}
	if e.mode&^fs.ModePerm != 0 {
		return e, fmt.Errorf("file %q: mode %v has bits other than permissions (hint: use a mode such as 0644 or 0755)", f.Name, f.Mode)
	}
	switch {
	case f.SourcePath != "" && f.Data != nil:
		return e, fmt.Errorf("file %q: both Data and SourcePath are set; set one", f.Name)
	case f.SourcePath != "":
		st, err := os.Stat(f.SourcePath)
		if err != nil {
			return e, fmt.Errorf("file %q: %w", f.Name, err)
		}
		if !st.Mode().IsRegular() {
			return e, fmt.Errorf("file %q: source %s is not a regular file", f.Name, f.SourcePath)
		}
		e.size = st.Size()
	default:
		e.size = int64(len(f.Data))
	}
	if e.size > MaxFileSize {
		return e, fmt.Errorf("file %q: %d bytes is larger than an ISO 9660 file can be (4 GiB - 1)", f.Name, e.size)
	}
	return e, nil
}

// ValidName reports whether name can be a file name in an image.
func ValidName(name string) error {
	if name == "" {
		return errors.New("file name is empty")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("file name %q is %d bytes long, more than %d", name, len(name), MaxNameLen)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("file name %q is reserved", name)
	}
	for _, r := range name {
		if !isNameChar(r) {
			return fmt.Errorf("file name %q contains %q (hint: use letters, digits, '.', '-' and '_')", name, r)
		}
	}
	return nil
}

func isNameChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_'
}

func validateVolumeID(id string) error {
	if id == "" || len(id) > 32 {
		return fmt.Errorf("volume id %q must be 1 to 32 characters long", id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("volume id %q contains %q (hint: use letters, digits, '-' and '_')", id, r)
		}
	}
	return nil
}

// shortNames assigns each entry a unique ISO 9660 level 1 identifier
// (NAME.EXT;1 with at most 8 + 3 characters from A-Z, 0-9 and '_'). Entries
// are sorted by name, so the assignment is deterministic.
func shortNames(entries []entry) {
	taken := map[string]bool{}
	for i := range entries {
		base, ext := shortParts(entries[i].file.Name)
		id := base + "." + ext
		for n := 1; taken[id]; n++ {
			suffix := fmt.Sprint(n)
			b := base
			if len(b)+len(suffix) > 8 {
				b = b[:8-len(suffix)]
			}
			id = b + suffix + "." + ext
		}
		taken[id] = true
		entries[i].isoID = id + ";1"
	}
}

// shortParts maps a name to its 8.3 base and extension.
func shortParts(name string) (base, ext string) {
	base = name
	if i := strings.LastIndexByte(name, '.'); i > 0 {
		base, ext = name[:i], name[i+1:]
	}
	base, ext = dChars(base), dChars(ext)
	if len(base) > 8 {
		base = base[:8]
	}
	if len(ext) > 3 {
		ext = ext[:3]
	}
	if base == "" {
		base = "_"
	}
	return base, ext
}

// dChars upper-cases s and replaces everything outside A-Z, 0-9 and '_'.
func dChars(s string) string {
	b := []byte(strings.ToUpper(s))
	for i, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

func writeContents(ctx context.Context, w io.Writer, e entry) error {
	if e.file.SourcePath == "" {
		_, err := w.Write(e.file.Data)
		return err
	}
	f, err := os.Open(e.file.SourcePath)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.CopyN(w, ctxReader{ctx, f}, e.size)
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%s shrank from %d to %d bytes while the image was written", e.file.SourcePath, e.size, n)
	}
	if err != nil {
		return err
	}
	if m, _ := f.Read(make([]byte, 1)); m > 0 {
		return fmt.Errorf("%s grew beyond %d bytes while the image was written", e.file.SourcePath, e.size)
	}
	return nil
}

// ctxReader stops a long copy when the context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// sectors returns how many sectors n bytes occupy.
func sectors(n int64) uint32 { return uint32((n + SectorSize - 1) / SectorSize) }

// padding returns how many zero bytes complete the last sector of n bytes.
func padding(n int64) int64 { return int64(sectors(n))*SectorSize - n }
