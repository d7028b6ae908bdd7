package gitws

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A Copying is a copy of a workspace made in up to two passes, for a
// workspace its VM may be writing to: Precopy copies what is there while
// the VM runs on, and Finish, run with the workspace still (the VM
// paused), makes the copy exactly the workspace as it is then, copying
// again only what may have changed since Precopy looked at it. The VM is
// paused for a walk of the tree and the files that changed, not for the
// whole copy. Finish alone is a copy in one pass.
//
// What the copy carries: directories, regular files (each copied,
// io.Copy's copy_file_range sharing extents where the filesystem can),
// symbolic links as links, never followed; modes, owners (when this
// process may set them) and times as they were. Other entries (sockets,
// FIFOs, devices) are named in ForkResult.Skipped. A copy never shares a
// file with the workspace. Given an earlier copy of the same workspace
// that nothing writes to (a checkpoint's: Reuse), a file unchanged since
// that copy was made is a hard link to that copy's file, not a copy.
type Copying struct {
	src, dst string
	// began is when Precopy began; seen is what it saw of each regular
	// file, before it copied it (nil: no Precopy).
	began time.Time
	seen  map[string]fileStamp
	// made is what the copy holds, by path relative to it: nothing but
	// these passes writes there, so Finish reads this, not the copy.
	made map[string]madeEntry
	// base is the earlier copy Reuse gave (nil: none); finished is what
	// Finish saw of each regular file as it looked, from when it began,
	// which WriteStamps keeps for the next copy's Reuse.
	base     *baseCopy
	finished Stamps
}

// Stamps is what a copy's last pass saw of the workspace's regular files
// (by path relative to it) and when that pass began: a file whose stamp
// is the same later, and whose last change was before the pass began, has
// the content the copy holds.
type Stamps struct {
	Began time.Time
	Files map[string]fileStamp
}

// baseCopy is an earlier copy of the workspace, at dir, and its Stamps.
type baseCopy struct {
	dir    string
	stamps Stamps
}

// madeEntry is an entry of the copy: its kind (fs.ModeDir, fs.ModeSymlink,
// 0 for a regular file), a link's target, and whether a regular file is
// linked to an earlier copy's.
type madeEntry struct {
	kind   fs.FileMode
	target string
	linked bool
}

// stampSlack is how long before Precopy began a file's last change must
// be for Finish to trust Precopy's copy of it. A change after Precopy
// looked at a file gives it a change time at or after Precopy's start,
// less the filesystem's granularity (a few milliseconds for the kernel's
// coarse clock, two seconds for FAT's times), so anything changed within
// this slack of the start is copied again whatever its stamp says.
var stampSlack = 3 * time.Second

// fileStamp is what identifies a file's content and attributes without
// reading it: a change to either changes its change time (ctime).
// Its fields are exported for encoding/gob (WriteStamps).
type fileStamp struct {
	Dev, Ino     uint64
	Size         int64
	Mtime, Ctime syscall.Timespec
	Mode         uint32
	UID, GID     uint32
}

func stampOf(fi fs.FileInfo) (fileStamp, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileStamp{}, false
	}
	return fileStamp{Dev: st.Dev, Ino: st.Ino, Size: st.Size, Mtime: st.Mtim, Ctime: st.Ctim,
		Mode: st.Mode, UID: st.Uid, GID: st.Gid}, true
}

// olderThan reports whether the file's last change is more than
// stampSlack before t: a change after t would have given it a later one.
func (s fileStamp) olderThan(t time.Time) bool {
	return time.Unix(s.Ctime.Unix()).Before(t.Add(-stampSlack))
}

// NewCopying checks that ws is a workspace and that dest does not exist;
// nothing is copied yet.
func (g *Git) NewCopying(ws, dest string) (*Copying, error) {
	root, err := realWorkspace(ws)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(dest); err == nil {
		return nil, fmt.Errorf("%s exists already; a workspace's copy is made afresh", dest)
	}
	return &Copying{src: root, dst: dest, made: map[string]madeEntry{}}, nil
}

// Reuse gives c an earlier copy of the same workspace, at dir, with the
// stamps WriteStamps kept of it at stamps: each file the workspace still
// has unchanged since is linked to that copy's, which must never be
// written to (a checkpoint's). A missing stamps file is no earlier copy;
// one that cannot be read is an error, and c copies everything.
func (c *Copying) Reuse(dir, stamps string) error {
	f, err := os.Open(stamps)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var st Stamps
	if err := gob.NewDecoder(f).Decode(&st); err != nil {
		return fmt.Errorf("reading %s: %w", stamps, err)
	}
	c.base = &baseCopy{dir: dir, stamps: st}
	return nil
}

// WriteStamps keeps, at path (0600), what Finish saw of the workspace, for
// a later copy's Reuse of this one. It is written as the copy is, plainly:
// the caller puts both in place together, synced.
func (c *Copying) WriteStamps(path string) error {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(c.finished); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o600)
}

// Abort removes what was copied.
func (c *Copying) Abort() {
	_ = os.RemoveAll(c.dst)
	c.made = map[string]madeEntry{}
}

// Precopy is the first pass: it copies the workspace as it finds it,
// passing over what goes away or changes kind under it (Finish sets that
// right). A directory keeps a mode this process can write in until
// Finish. On an error it removes what it copied.
func (c *Copying) Precopy(ctx context.Context) error {
	c.began, c.seen = time.Now(), map[string]fileStamp{}
	err := c.walk(ctx, true, &ForkResult{})
	if err != nil {
		c.Abort()
		return fmt.Errorf("copying the workspace %s to %s: %w", c.src, c.dst, err)
	}
	return nil
}

// Finish makes the copy exactly the workspace as it is now (which must
// not change meanwhile) and says what it holds; Commit is left to the
// caller (Head). On an error it removes what it copied.
func (c *Copying) Finish(ctx context.Context) (*ForkResult, error) {
	res := &ForkResult{}
	c.finished = Stamps{Began: time.Now(), Files: map[string]fileStamp{}}
	if err := c.walk(ctx, false, res); err != nil {
		c.Abort()
		return nil, fmt.Errorf("copying the workspace %s to %s: %w", c.src, c.dst, err)
	}
	return res, nil
}

// walk is one pass over the workspace (first: Precopy's, else Finish's).
func (c *Copying) walk(ctx context.Context, first bool, res *ForkResult) error {
	type dirAttrs struct {
		path  string
		perm  fs.FileMode
		mtime time.Time
	}
	// A directory's mode and time are set last: writing into it changes
	// its time, and a mode without write would refuse its entries.
	var dirs []dirAttrs
	present := map[string]bool{}
	gone := func(err error) bool {
		return first && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, errChanged))
	}
	err := filepath.WalkDir(c.src, func(path string, d fs.DirEntry, err error) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err != nil {
			if gone(err) {
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(c.src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(c.dst, rel)
		fi, err := os.Lstat(path)
		if err != nil {
			if gone(err) {
				return nil
			}
			return err
		}
		present[rel] = true
		have, exists := c.made[rel]
		switch mode := fi.Mode(); {
		case mode.IsDir():
			if !exists || have.kind != fs.ModeDir {
				if err := c.replace(rel, exists, madeEntry{kind: fs.ModeDir}, func() error { return os.Mkdir(to, 0o700) }); err != nil {
					return err
				}
			}
			if !first {
				dirs = append(dirs, dirAttrs{to, mode.Perm(), fi.ModTime()})
			}
		case mode.IsRegular():
			stamp, _ := stampOf(fi)
			if !first {
				c.finished.Files[rel] = stamp
			}
			if !first && exists && have.kind == 0 && c.unchanged(rel, stamp) {
				res.Files++
				res.Bytes += fi.Size()
				if have.linked {
					res.Linked++
					res.LinkedBytes += fi.Size()
				}
				return nil
			}
			var n int64
			linked := false
			err := c.replace(rel, exists, madeEntry{}, func() (err error) {
				if linked = c.link(rel, to, stamp); linked {
					n = fi.Size()
					return nil
				}
				n, err = copyFile(path, to, mode.Perm())
				return err
			})
			if err != nil {
				if gone(err) {
					c.remove(rel)
					return nil
				}
				return err
			}
			if first {
				c.seen[rel] = stamp
			}
			res.Files++
			res.Bytes += n
			res.Copied++
			if linked {
				// The earlier copy's file has the workspace file's
				// mode, owner and times (its stamp says so), and is
				// not to be touched.
				c.made[rel] = madeEntry{linked: true}
				res.Linked++
				res.LinkedBytes += n
				return nil
			}
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				if gone(err) {
					return nil
				}
				return err
			}
			link := madeEntry{kind: fs.ModeSymlink, target: target}
			if !exists || have != link {
				if err := c.replace(rel, exists, link, func() error { return os.Symlink(target, to) }); err != nil {
					return err
				}
			}
		default:
			if exists {
				if err := c.remove(rel); err != nil {
					return err
				}
			}
			res.Skipped = append(res.Skipped, rel)
			return nil
		}
		return keepAttrs(to, fi)
	})
	if err != nil || first {
		return err
	}
	// What the workspace no longer has (Precopy copied it) goes.
	for rel := range c.made {
		if !present[rel] {
			if err := c.remove(rel); err != nil {
				return err
			}
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Chmod(dirs[i].path, dirs[i].perm); err != nil {
			return err
		}
		if err := os.Chtimes(dirs[i].path, dirs[i].mtime, dirs[i].mtime); err != nil {
			return err
		}
	}
	return nil
}

// replace makes the entry rel of the copy with create, as e, removing what
// is there first (exists).
func (c *Copying) replace(rel string, exists bool, e madeEntry, create func() error) error {
	if exists {
		if err := c.remove(rel); err != nil {
			return err
		}
	}
	err := create()
	if err == nil {
		c.made[rel] = e
	}
	return err
}

// remove removes the entry rel of the copy, and what it held.
func (c *Copying) remove(rel string) error {
	if err := os.RemoveAll(filepath.Join(c.dst, rel)); err != nil {
		return err
	}
	if c.made[rel].kind == fs.ModeDir {
		prefix := rel + string(filepath.Separator)
		for r := range c.made {
			if strings.HasPrefix(r, prefix) {
				delete(c.made, r)
			}
		}
	}
	delete(c.made, rel)
	return nil
}

// unchanged reports whether Precopy's copy of the file rel still holds:
// the file is the one it copied, with the stamp it had before it was
// copied, and its last change is older than Precopy's start by more than
// stampSlack.
func (c *Copying) unchanged(rel string, now fileStamp) bool {
	was, ok := c.seen[rel]
	return ok && was == now && now.olderThan(c.began)
}

// link makes the copy's file rel, at to, a hard link to the earlier copy's
// (Reuse) when that holds the workspace file's content as it is now: the
// file had the stamp it has now when the earlier copy's last pass looked
// at it, and had last changed before that pass began. It reports whether
// it linked; anything else (no such file there, another filesystem, too
// many links) leaves the file to be copied.
func (c *Copying) link(rel, to string, now fileStamp) bool {
	if c.base == nil {
		return false
	}
	was, ok := c.base.stamps.Files[rel]
	if !ok || was != now || !now.olderThan(c.base.stamps.Began) {
		return false
	}
	from := filepath.Join(c.base.dir, rel)
	if fi, err := os.Lstat(from); err != nil || !fi.Mode().IsRegular() || fi.Size() != now.Size {
		return false
	}
	return os.Link(from, to) == nil
}

// errChanged is a file that changed kind while it was copied.
var errChanged = errors.New("changed while it was copied")

// copyFile copies the regular file src to dst, made afresh with perm. It
// opens src without following a link or waiting on a FIFO, and copies it
// only if what it opened is still a regular file.
func copyFile(src, dst string, perm fs.FileMode) (int64, error) {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil || !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%s %w", src, errChanged)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm|0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// keepAttrs gives the copy at to the owner, permissions and time of fi
// (a directory's permissions and time are Finish's, set last); an owner
// this process may not give (not root) stays its own. Set-id bits are not
// carried: a guest's file is not made set-id on the host.
func keepAttrs(to string, fi fs.FileInfo) error {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Lchown(to, int(st.Uid), int(st.Gid)); err != nil && !errors.Is(err, fs.ErrPermission) {
			return err
		}
	}
	if !fi.Mode().IsRegular() {
		return nil // a link's own mode means nothing; a directory's come last
	}
	if err := os.Chmod(to, fi.Mode().Perm()); err != nil {
		return err
	}
	return os.Chtimes(to, fi.ModTime(), fi.ModTime())
}
