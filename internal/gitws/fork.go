package gitws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// ForkResult says what a workspace fork copied.
type ForkResult struct {
	// Commit is the new branch's start: the source workspace's HEAD.
	Commit string
	// Files, Bytes: the regular files copied and their size.
	Files int
	Bytes int64
	// Skipped are the entries a copy cannot carry (sockets, FIFOs, device
	// nodes), relative to the workspace: what listened or waited on them
	// is a process, which the fork's memory brings, not its files.
	Skipped []string
}

// Fork copies the workspace ws into dest, which must not exist, as it is at
// this moment (Copy), and puts the copy on a new branch at ws's HEAD
// without touching its work tree: the copy's changes stay changes. The
// caller keeps ws still meanwhile (the VM paused). Nothing of the
// workspace runs: git runs in the copy hardened as everywhere here. A
// failure removes what was copied.
func (g *Git) Fork(ctx context.Context, ws, dest, branch string) (res *ForkResult, err error) {
	if err := g.CheckBranchName(ctx, branch); err != nil {
		return nil, err
	}
	if res, err = g.Copy(ctx, ws, dest); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dest)
		}
	}()
	r := repo{work: dest, gitDir: filepath.Join(dest, ".git")}
	if res.Commit == "" {
		return nil, fmt.Errorf("the workspace %s has no commit at HEAD to fork from", ws)
	}
	if g.refExistsIn(ctx, r, "refs/heads/"+branch) {
		return nil, fmt.Errorf("the workspace %s has a branch %q already (hint: fork into a branch name it does not have)", ws, branch)
	}
	// update-ref and symbolic-ref write refs only: no checkout, so no
	// hook, filter or work-tree change.
	if _, err := g.untrusted(ctx, r, "update-ref", "-m", "agent-vm fork", "refs/heads/"+branch, res.Commit, ""); err != nil {
		return nil, fmt.Errorf("making branch %q in the fork: %s", branch, termsafe.String(err.Error()))
	}
	if _, err := g.untrusted(ctx, r, "symbolic-ref", "HEAD", "refs/heads/"+branch); err != nil {
		return nil, fmt.Errorf("putting the fork on branch %q: %s", branch, termsafe.String(err.Error()))
	}
	return res, nil
}

// Copy copies the workspace ws into dest, which must not exist, exactly as
// it is (uncommitted changes, untracked and ignored files, the git
// directory, modes, owners and times; every file a copy of its own, never
// a hard link to ws's, so the two diverge from here; symbolic links as
// links, never followed). Res.Commit is ws's HEAD ("" on an unborn
// branch). A failure removes what was copied.
func (g *Git) Copy(ctx context.Context, ws, dest string) (res *ForkResult, err error) {
	root, err := realWorkspace(ws)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(dest); err == nil {
		return nil, fmt.Errorf("%s exists already; a workspace's copy is made afresh", dest)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dest)
		}
	}()
	res = &ForkResult{}
	if err := copyTree(ctx, root, dest, res); err != nil {
		return nil, fmt.Errorf("copying the workspace %s to %s: %w", ws, dest, err)
	}
	r := repo{work: dest, gitDir: filepath.Join(dest, ".git")}
	res.Commit, _ = g.untrusted(ctx, r, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
	return res, nil
}

// refExistsIn reports whether ref exists in the workspace repository r.
func (g *Git) refExistsIn(ctx context.Context, r repo, ref string) bool {
	_, err := g.untrusted(ctx, r, "show-ref", "--verify", "--quiet", ref)
	return err == nil
}

// copyTree copies the tree at src to dst (made here), entry by entry:
// directories, regular files (each copied, io.Copy's copy_file_range
// sharing extents where the filesystem can, never a hard link), symbolic
// links as links; modes, owners (when this process may set them) and
// times as they were. Other entries are counted in res.Skipped.
func copyTree(ctx context.Context, src, dst string, res *ForkResult) error {
	type dirAttrs struct {
		path  string
		perm  fs.FileMode
		mtime time.Time
	}
	// A directory's mode and time are set last: writing into it changes
	// its time, and a mode without write would refuse its entries.
	var dirs []dirAttrs
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		switch mode := fi.Mode(); {
		case mode.IsDir():
			if err := os.Mkdir(to, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirAttrs{to, mode.Perm(), fi.ModTime()})
		case mode.IsRegular():
			n, err := copyFile(path, to, mode.Perm())
			if err != nil {
				return err
			}
			res.Files++
			res.Bytes += n
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
		default:
			res.Skipped = append(res.Skipped, rel)
			return nil
		}
		return keepAttrs(to, fi)
	})
	if err != nil {
		return err
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
		return 0, fmt.Errorf("%s changed while it was copied", src)
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
// (a directory's permissions and time are copyTree's, set last); an owner
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
