package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/hostdir"
)

const (
	locksDir = ".locks"
	tmpDir   = ".tmp"
	trashDir = ".trash"
	// Locks of agent-vm's own start with a dot: a VM's lock is <slug>.lock
	// and no slug starts with one (a branch named "ports" must not share
	// the port allocator's lock).
	portLock  = ".ports.lock"
	sweepLock = ".sweep.lock"
)

// Root is an opened state directory.
type Root struct{ Dir string }

// The state directory's own directories, private as it is.
const dotDirMode = 0o700

// Open makes sure the state directory dir exists with its mode (see
// hostdir) and returns it. It also sweeps what killed creates and destroys
// left behind. A relative top directory is taken from the working
// directory.
func Open(dir *hostdir.Dir) (*Root, error) {
	if dir == nil || dir.Path == "" {
		return nil, errors.New("state directory is empty (hint: set --state-dir or AGENT_VM_STATE_DIR)")
	}
	if !filepath.IsAbs(dir.Path) && dir.Parent == nil {
		abs, err := filepath.Abs(dir.Path)
		if err != nil {
			return nil, fmt.Errorf("state directory %q: %w", dir.Path, err)
		}
		top := *dir
		top.Path = abs
		dir = &top
	}
	for _, d := range []*hostdir.Dir{dir, dir.Sub(locksDir, dotDirMode), dir.Sub(tmpDir, dotDirMode), dir.Sub(trashDir, dotDirMode)} {
		if err := d.Make(); err != nil {
			return nil, fmt.Errorf("creating state directory %s: %w (hint: choose a writable --state-dir)", dir.Path, err)
		}
	}
	r := &Root{Dir: dir.Path}
	r.sweep()
	return r, nil
}

// Layout returns the layout of the VM with this slug.
func (r *Root) Layout(slug string) Layout { return Layout{Dir: filepath.Join(r.Dir, slug)} }

// LockVM takes the per-VM lock, serialising create, start, stop and destroy
// of one VM across processes.
func (r *Root) LockVM(ctx context.Context, slug string) (*Lock, error) {
	return AcquireLock(ctx, filepath.Join(r.Dir, locksDir, slug+".lock"))
}

// LockPorts serialises port allocation across processes.
func (r *Root) LockPorts(ctx context.Context) (*Lock, error) {
	return AcquireLock(ctx, filepath.Join(r.Dir, locksDir, portLock))
}

// Entry is one VM directory as List found it: a record, or why there is none.
type Entry struct {
	Slug   string
	Layout Layout
	Record *Record // nil when Err is set
	Err    error
}

// List returns every VM directory, sorted by slug. A corrupt or unreadable
// record becomes an Entry with Err set; it never fails the listing.
func (r *Root) List() ([]Entry, error) {
	des, err := os.ReadDir(r.Dir)
	if err != nil {
		return nil, fmt.Errorf("reading state directory %s: %w", r.Dir, err)
	}
	var out []Entry
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, ".") || !de.IsDir() {
			continue
		}
		out = append(out, r.entry(name))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Slug < out[j].Slug })
	return out, nil
}

func (r *Root) entry(slug string) Entry {
	e := Entry{Slug: slug, Layout: r.Layout(slug)}
	if !ValidSlug(slug) {
		e.Err = fmt.Errorf("%s is not an agent-vm VM directory (hint: move it out of the state directory)", e.Layout.Dir)
		return e
	}
	rec, err := ReadRecord(e.Layout.Record())
	if errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("%s has no %s, so it is not a complete VM (hint: remove the directory if nothing in it is yours)", e.Layout.Dir, RecordFile)
	}
	if err == nil && rec.Slug != slug {
		err = fmt.Errorf("%s: record says slug %q but lives in %q", e.Layout.Record(), rec.Slug, slug)
	}
	e.Record, e.Err = rec, err
	if err != nil {
		e.Record = nil
	}
	return e
}

// TryLockVM takes the per-VM lock if nobody holds it.
func (r *Root) TryLockVM(slug string) (*Lock, bool, error) {
	return TryLock(filepath.Join(r.Dir, locksDir, slug+".lock"))
}

// Staging is a VM directory being built. Nothing outside .tmp sees it until
// Commit renames it into place; if the creating process dies, the next
// Open sweeps it away.
type Staging struct {
	Layout Layout // the staging directory (use it to write files)
	slug   string
	root   *Root
	lock   *Lock
	lockP  string
}

// BeginCreate starts building a VM directory for slug.
func (r *Root) BeginCreate(slug string) (*Staging, error) {
	if !ValidSlug(slug) {
		return nil, fmt.Errorf("invalid VM name %q", slug)
	}
	name := slug + "." + randHex(6)
	lockP := filepath.Join(r.Dir, tmpDir, name+".lock")
	lock, err := r.newOwnerLock(lockP)
	if err != nil {
		return nil, fmt.Errorf("starting create of %s: %w", slug, err)
	}
	dir := filepath.Join(r.Dir, tmpDir, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		lock.Release()
		os.Remove(lockP)
		return nil, fmt.Errorf("starting create of %s: %w", slug, err)
	}
	return &Staging{Layout: Layout{Dir: dir}, slug: slug, root: r, lock: lock, lockP: lockP}, nil
}

// Commit moves the staging directory to its final place. It fails if a VM
// directory with that slug appeared meanwhile (the caller holds the VM lock,
// so that means another process ignored it).
func (s *Staging) Commit() (Layout, error) {
	final := s.root.Layout(s.slug)
	if _, err := os.Lstat(final.Dir); err == nil {
		return Layout{}, fmt.Errorf("%s already exists", final.Dir)
	}
	if err := os.Rename(s.Layout.Dir, final.Dir); err != nil {
		return Layout{}, fmt.Errorf("moving %s into place: %w", s.Layout.Dir, err)
	}
	s.Layout = final
	s.release()
	return final, nil
}

// Abort removes the staging directory. It is a no-op after Commit.
func (s *Staging) Abort() {
	if s.lock == nil {
		return
	}
	_ = removeAll(s.Layout.Dir)
	s.release()
}

func (s *Staging) release() {
	os.Remove(s.lockP)
	s.lock.Release()
	s.lock = nil
}

// Remove deletes a VM directory: it is first renamed into .trash (one atomic
// step, after which the VM no longer exists), then deleted. Only that one
// directory is ever touched, and symlinks inside are removed, not followed.
func (r *Root) Remove(slug string) error {
	if !ValidSlug(slug) {
		return fmt.Errorf("refusing to remove %q: not a VM name", slug)
	}
	dir := r.Layout(slug).Dir
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("refusing to remove %s: not a directory", dir)
	}
	name := slug + "." + randHex(6)
	lockP := filepath.Join(r.Dir, trashDir, name+".lock")
	lock, err := r.newOwnerLock(lockP)
	if err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	defer func() { os.Remove(lockP); lock.Release() }()
	trash := filepath.Join(r.Dir, trashDir, name)
	if err := os.Rename(dir, trash); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	if err := removeAll(trash); err != nil {
		return fmt.Errorf("the VM is gone, but deleting its files in %s failed: %w (hint: remove that directory by hand)", trash, err)
	}
	return nil
}

// StagedRecords returns the records of creates in progress whose creator is
// alive, so port allocation can avoid the ports they hold.
func (r *Root) StagedRecords() []*Record {
	var out []*Record
	locks, _ := filepath.Glob(filepath.Join(r.Dir, tmpDir, "*.lock"))
	for _, lp := range locks {
		dir := strings.TrimSuffix(lp, ".lock")
		rec, err := ReadRecord(filepath.Join(dir, RecordFile))
		if err == nil {
			out = append(out, rec)
		}
	}
	return out
}

// sweep removes staging and trash directories whose owning process died.
// A directory whose lock is still held belongs to a live process and stays.
// It decides under the sweep guard (see newOwnerLock) and deletes after,
// holding each dead entry's lock, so creates wait only for the decision.
func (r *Root) sweep() {
	type dead struct {
		dir, lockP string
		lock       *Lock
	}
	var found []dead
	release, err := r.sweepGuard(syscall.LOCK_EX)
	if err != nil {
		return // sweeping is housekeeping: the next command tries again
	}
	for _, d := range []string{tmpDir, trashDir} {
		base := filepath.Join(r.Dir, d)
		des, err := os.ReadDir(base)
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, de := range des {
			name := strings.TrimSuffix(de.Name(), ".lock")
			if seen[name] {
				continue
			}
			seen[name] = true
			lockP := filepath.Join(base, name+".lock")
			lock, ok, err := TryLock(lockP)
			if err != nil || !ok {
				continue
			}
			found = append(found, dead{dir: filepath.Join(base, name), lockP: lockP, lock: lock})
		}
	}
	release()
	for _, e := range found {
		_ = removeAll(e.dir)
		os.Remove(e.lockP)
		e.lock.Release()
	}
}

// newOwnerLock creates and locks the lock file that marks a staging or
// trash entry as owned by this process. Between creating that file and
// locking it, a sweep in another process would find it free and take the
// entry for a dead one; so owners do both under the sweep guard held shared,
// and the sweep takes it exclusively.
func (r *Root) newOwnerLock(path string) (*Lock, error) {
	release, err := r.sweepGuard(syscall.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer release()
	lock, ok, err := TryLock(path)
	if err != nil {
		return nil, err
	}
	if !ok {
		// A random name nobody else uses: only a broken flock gets here.
		return nil, fmt.Errorf("lock %s is held by another process", path)
	}
	return lock, nil
}

// sweepGuard takes the sweep guard (an flock on .locks/.sweep.lock) shared
// or exclusive, waiting for it: holders keep it for a few file operations.
func (r *Root) sweepGuard(how int) (release func(), err error) {
	p := filepath.Join(r.Dir, locksDir, sweepLock)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", p, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", p, err)
	}
	return func() { f.Close() }, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// NewID returns a random VM id formatted as a UUID (QEMU's -uuid).
func NewID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// MigrateRepo fills in the repository of e's record, written before VMs
// had one, from its source checkout (repoID: gitws's RepoID), and saves it
// when nobody else holds the VM (busy: the next command saves it). A
// source that is gone leaves it empty: that VM then matches no repository
// and is found from outside any repository only. The error is the save's.
func (r *Root) MigrateRepo(e Entry, repoID func(source string) (string, error)) error {
	if e.Record.Git.Source == "" {
		return nil
	}
	id, err := repoID(e.Record.Git.Source)
	if err != nil {
		return nil
	}
	e.Record.Git.Repo = id
	lock, ok, err := r.TryLockVM(e.Slug)
	if err != nil || !ok {
		return nil
	}
	defer lock.Release()
	rec, err := ReadRecord(e.Layout.Record())
	if err != nil || rec.Git.Repo != "" {
		return nil
	}
	rec.Git.Repo = id
	return WriteRecord(e.Layout.Record(), rec)
}
