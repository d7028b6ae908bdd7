package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/flock"
	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// Cache layout, below the cache root.
const (
	locksDir   = ".locks"   // <name>.lock: one build or pull of a name at a time
	tmpDir     = ".tmp"     // <name>.<rand>/: work in progress, renamed into .store when complete
	storeDir   = ".store"   // <name>/<version>/: complete, immutable images
	partialDir = ".partial" // <name>/: a pull's partial download, kept for resuming
)

// store is an open image cache.
type store struct {
	root string
	dir  *hostdir.Dir // root, with the levels above it that are agent-vm's
	// uid and gid own what the store creates, or are -1 to leave ownership
	// alone. When root (e.g. `sudo agent-vm image build`, into the invoking
	// user's cache) writes into a cache that belongs to a user, the new
	// files go to that user, so their own later pulls and builds still work.
	uid, gid int
}

// errNoCache is a build or pull without Cache.
var errNoCache = errors.New("internal error: no image cache directory given")

// openStore opens (creating as needed, each directory with its mode) the
// cache dir; euid is the effective uid of this process.
func openStore(dir *hostdir.Dir, euid int) (*store, error) {
	if dir == nil || dir.Path == "" {
		return nil, errNoCache
	}
	abs, err := filepath.Abs(dir.Path)
	if err != nil {
		return nil, fmt.Errorf("image cache %q: %w", dir.Path, err)
	}
	s := &store{root: abs, dir: dir, uid: -1, gid: -1}
	existing := abs
	for {
		if _, err := os.Stat(existing); err == nil || filepath.Dir(existing) == existing {
			break
		}
		existing = filepath.Dir(existing)
	}
	if fi, err := os.Stat(existing); err == nil && euid == 0 {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
			s.uid, s.gid = int(st.Uid), int(st.Gid)
		}
	}
	for _, d := range []*hostdir.Dir{dir, dir.Sub(locksDir, 0o755), dir.Sub(tmpDir, 0o755), dir.Sub(storeDir, 0o755)} {
		if err := s.mkdir(d); err != nil {
			return nil, fmt.Errorf("creating the image cache: %w (hint: check the permissions of %s, or pass another cache directory)", err, abs)
		}
	}
	return s, nil
}

// mkdir makes d (see hostdir), for the cache's owner when the store has
// one to give it to.
func (s *store) mkdir(d *hostdir.Dir) error {
	if s.uid >= 0 {
		return d.MakeFor(hostdir.Owner{UID: s.uid, GID: s.gid})
	}
	return d.Make()
}

// own gives path to the cache's owner, when the store has one to give.
func (s *store) own(path string) {
	if s.uid >= 0 {
		_ = os.Lchown(path, s.uid, s.gid)
	}
}

// ownTree gives path and everything below it to the cache's owner.
func (s *store) ownTree(path string) error {
	if s.uid < 0 {
		return nil
	}
	return filepath.WalkDir(path, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, s.uid, s.gid)
	})
}

// lock takes the per-name lock, waiting (and saying so on progress) while
// another process holds it. The lock is released by the returned func, or by
// the kernel if this process dies.
func (s *store) lock(ctx context.Context, name string, progress io.Writer) (unlock func(), err error) {
	path := filepath.Join(s.root, locksDir, name+".lock")
	l, err := flock.Acquire(ctx, path, 0o644, func() {
		fmt.Fprintf(progress, "==> waiting for another build or pull of %s to finish\n", name)
	})
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", name, err)
	}
	s.own(path)
	return l.Release, nil
}

// tempDir makes a fresh work directory for name under .tmp.
func (s *store) tempDir(name string) (string, error) {
	dir, err := os.MkdirTemp(filepath.Join(s.root, tmpDir), name+".")
	if err != nil {
		return "", fmt.Errorf("creating a work directory: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating a work directory: %w", err)
	}
	s.own(dir)
	return dir, nil
}

// sweep removes work directories that earlier, interrupted runs for name left
// behind. Call it only while holding name's lock: then no live process owns
// them.
func (s *store) sweep(name string) error {
	matches, err := filepath.Glob(filepath.Join(s.root, tmpDir, name+".*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range matches {
		if err := removeTree(m); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing what an interrupted build left behind: %w", err)
	}
	return nil
}

// publish moves the complete image in work (a directory from tempDir) into
// the store as a new version and points <root>/<name> at it. Both steps are
// renames, so readers see the old image or the new one, never a mix.
func (s *store) publish(name, work string, created time.Time) (string, error) {
	versions := s.dir.Sub(storeDir, 0o755).Sub(name, 0o755)
	if err := s.mkdir(versions); err != nil {
		return "", fmt.Errorf("publishing image %q: %w", name, err)
	}
	if err := s.ownTree(work); err != nil {
		return "", fmt.Errorf("publishing image %q: %w", name, err)
	}
	if err := atomicfile.SyncDir(work); err != nil {
		return "", fmt.Errorf("publishing image %q: %w", name, err)
	}
	id := created.UTC().Format("20060102T150405Z")
	dir := filepath.Join(versions.Path, id)
	for i := 2; ; i++ {
		err := os.Rename(work, dir)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
			return "", fmt.Errorf("publishing image %q: %w", name, err)
		}
		dir = filepath.Join(versions.Path, fmt.Sprintf("%s-%d", id, i))
	}
	if err := atomicfile.SyncDir(versions.Path); err != nil {
		return "", fmt.Errorf("publishing image %q: %w", name, err)
	}
	link := filepath.Join(s.root, name)
	if fi, err := os.Lstat(link); err == nil && fi.Mode()&fs.ModeSymlink == 0 {
		return "", fmt.Errorf("publishing image %q: %s exists and is not an image link (hint: move it out of the image cache)", name, link)
	}
	tmpLink := filepath.Join(s.root, tmpDir, name+".link-"+randomHex(4))
	target, err := filepath.Rel(s.root, dir)
	if err != nil {
		return "", err
	}
	if err := os.Symlink(target, tmpLink); err != nil {
		return "", fmt.Errorf("publishing image %q: %w", name, err)
	}
	s.own(tmpLink)
	if err := os.Rename(tmpLink, link); err != nil {
		_ = os.Remove(tmpLink)
		return "", fmt.Errorf("publishing image %q: %w", name, err)
	}
	if err := atomicfile.SyncDir(s.root); err != nil {
		return "", fmt.Errorf("publishing image %q: %w", name, err)
	}
	return dir, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// removeTree removes path and everything below it, like os.RemoveAll, with
// two safeguards for root filesystems that a killed mmdebstrap left behind:
// it first detaches any mount below path (its /proc, /sys and /dev bind
// mounts), and it never descends into a directory on another filesystem.
func removeTree(path string) error {
	if err := unmountUnder(path); err != nil {
		return err
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return removeOnDevice(path, fi, deviceOf(fi))
}

func removeOnDevice(path string, fi fs.FileInfo, dev uint64) error {
	if !fi.IsDir() {
		return ignoreNotExist(os.Remove(path))
	}
	if deviceOf(fi) != dev {
		return fmt.Errorf("refusing to remove %s: it is on another filesystem (hint: unmount it, then remove %s)", path, path)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return ignoreNotExist(err)
	}
	var errs []error
	for _, e := range entries {
		child := filepath.Join(path, e.Name())
		cfi, err := os.Lstat(child)
		if err != nil {
			errs = append(errs, ignoreNotExist(err))
			continue
		}
		errs = append(errs, removeOnDevice(child, cfi, dev))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ignoreNotExist(os.Remove(path))
}

func deviceOf(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev) // Dev is uint32 on some platforms
	}
	return 0
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// unmountUnder lazily detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	mounts, err := mountsUnder("/proc/self/mountinfo", dir)
	if err != nil || len(mounts) == 0 {
		return err
	}
	var errs []error
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points in a mountinfo file that are dir or
// below it, deepest first.
func mountsUnder(mountinfo, dir string) ([]string, error) {
	b, err := os.ReadFile(mountinfo)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space, ...) that
// mountinfo uses in paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) && isOctal(s[i+1:i+4]) {
			v := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			b.WriteByte(v)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '7' {
			return false
		}
	}
	return true
}
