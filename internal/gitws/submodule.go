package gitws

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// submodules inspects each submodule checked out in r and adds those with
// unsaved work to u. A submodule directory that is not checked out but
// holds files anyway counts as untracked: git itself never looks there.
func (in *inspection) submodules(ctx context.Context, r repo, u *Unsaved, source string, depth int) error {
	paths, err := in.gitlinks(ctx, r)
	if err != nil {
		return err
	}
	for _, p := range paths {
		sub, ok, err := in.submodule(r, p)
		if err != nil {
			return err
		}
		if !ok {
			if entries, _ := os.ReadDir(filepath.Join(r.work, p)); len(entries) > 0 {
				u.Untracked = append(u.Untracked, p+"/")
			}
			continue
		}
		if in.seen[sub.gitDir] {
			continue
		}
		if depth+1 > maxDepth {
			return fmt.Errorf("the submodule %s is nested more than %d deep; not looking further", termsafe.String(sub.path), maxDepth)
		}
		var subSource string
		if source != "" {
			subSource = filepath.Join(source, p)
		}
		su, err := in.repo(ctx, sub, subSource, depth+1)
		if err != nil {
			return err
		}
		if !su.Empty() || len(su.Risky) > 0 {
			u.Submodules = append(u.Submodules, Submodule{Path: p, Unsaved: *su})
		}
	}
	return nil
}

// gitlinks lists the paths of r's index that are submodules.
func (in *inspection) gitlinks(ctx context.Context, r repo) ([]string, error) {
	out, err := in.g.untrusted(ctx, r, "ls-files", "--stage", "-z")
	if err != nil {
		return nil, fmt.Errorf("listing the submodules of %s: %w", in.root, err)
	}
	var paths []string
	seen := map[string]bool{}
	for _, e := range strings.Split(out, "\x00") {
		meta, path, ok := strings.Cut(e, "\t")
		if ok && strings.HasPrefix(meta, "160000 ") && !seen[path] {
			seen[path] = true
			paths = append(paths, path)
		}
	}
	return paths, nil
}

// submodule resolves the submodule at p in parent: its work tree must be a
// real directory at that path (no symlink on the way) and its git
// directory, whether .git is a directory or a "gitdir:" file, must lie
// inside the workspace. ok is false when it is not checked out.
func (in *inspection) submodule(parent repo, p string) (r repo, ok bool, err error) {
	work := filepath.Join(parent.work, p)
	rel := filepath.Join(parent.path, p)
	shown := termsafe.String(rel)
	if real, err := filepath.EvalSymlinks(work); err != nil {
		return repo{}, false, nil // not there: nothing to lose
	} else if real != work {
		return repo{}, false, fmt.Errorf("the submodule %s is a symlink to %s, outside its place in the workspace; refusing to look there", shown, termsafe.String(real))
	}
	dotGit := filepath.Join(work, ".git")
	fi, err := os.Lstat(dotGit)
	switch {
	case os.IsNotExist(err):
		return repo{}, false, nil
	case err != nil:
		return repo{}, false, err
	case fi.IsDir():
		return repo{work: work, gitDir: dotGit, path: rel}, true, nil
	case !fi.Mode().IsRegular() || fi.Size() > 4096:
		return repo{}, false, fmt.Errorf("the submodule %s has a .git that is neither a directory nor a gitdir file; refusing to look there", shown)
	}
	data, err := os.ReadFile(dotGit)
	if err != nil {
		return repo{}, false, err
	}
	gd, found := strings.CutPrefix(strings.TrimRight(string(data), "\r\n"), "gitdir: ")
	if !found {
		return repo{}, false, fmt.Errorf("the submodule %s has a .git file that names no gitdir; refusing to look there", shown)
	}
	if !filepath.IsAbs(gd) {
		gd = filepath.Join(work, gd)
	}
	real, err := filepath.EvalSymlinks(gd)
	if err != nil || !strings.HasPrefix(real, in.root+string(filepath.Separator)) {
		return repo{}, false, fmt.Errorf("the submodule %s has its git directory %s outside the workspace; refusing to look there", shown, termsafe.String(gd))
	}
	return repo{work: work, gitDir: real, path: rel}, true, nil
}
