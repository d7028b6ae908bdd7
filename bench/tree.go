package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The source tree stands for a project's checkout: the VMs' workspaces are
// clones of a repository holding it (so `git status` in P6 runs on a real
// tree), and P6 unpacks it as a tarball. The default is Go's own src/cmd
// (about 4,400 files, 64 MB), which every machine that runs the harness
// has; the notes measured a 5,721-file tree. A tree of a few hundred files
// unpacks in about a second under TCG, too close to the noise.

// defaultTree is GOROOT/src/cmd of the Go that runs the harness.
func defaultTree(ctx context.Context) (string, error) {
	res := runCmd(ctx, cmdSpec{Path: "go", Args: []string{"env", "GOROOT"}, Timeout: quickTimeout})
	if res.Err != nil {
		return "", res.Err
	}
	return filepath.Join(strings.TrimSpace(res.Stdout), "src", "cmd"), nil
}

// tarball packs the tree once, with every file and directory writable by
// its owner (module cache trees are read-only, which would make the
// unpacked copy impossible to remove as a normal user).
func (l *lab) tarball(ctx context.Context) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tar != "" {
		return l.tar, nil
	}
	n := 0
	err := filepath.WalkDir(l.cfg.Tree, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("reading the source tree %s (hint: -tree DIR picks another): %w", l.cfg.Tree, err)
	}
	tar := filepath.Join(l.dir, "tree.tar")
	res := runCmd(ctx, cmdSpec{Path: "tar", Args: []string{"-C", l.cfg.Tree, "--mode=u+w", "--owner=0", "--group=0", "-cf", tar, "."}, Timeout: quickTimeout})
	if res.Err != nil {
		return "", res.Err
	}
	l.tar, l.treeFiles = tar, n
	return tar, nil
}

// sourceRepo is a git repository with the tree committed on branch main,
// made once; the VMs' workspaces are clones of it.
func (l *lab) sourceRepo(ctx context.Context) (string, error) {
	tar, err := l.tarball(ctx)
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.repo != "" {
		return l.repo, nil
	}
	repo := filepath.Join(l.dir, "src")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		return "", err
	}
	if res := runCmd(ctx, cmdSpec{Path: "tar", Args: []string{"-xf", tar, "-C", repo}, Timeout: quickTimeout}); res.Err != nil {
		return "", res.Err
	}
	if err := initRepo(ctx, l.dir, repo); err != nil {
		return "", err
	}
	l.repo = repo
	return repo, nil
}

// initRepo makes dir a git repository with its contents committed on main,
// isolated from the user's and the system's git configuration.
func initRepo(ctx context.Context, home, dir string) error {
	env := append(os.Environ(), "HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C",
		"GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@localhost",
		"GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@localhost")
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "-A"},
		{"commit", "-q", "--allow-empty", "-m", "bench source tree"},
	} {
		if res := runCmd(ctx, cmdSpec{Path: "git", Args: args, Dir: dir, Env: env, Timeout: quickTimeout}); res.Err != nil {
			return res.Err
		}
	}
	return nil
}
