// Package gitws manages a VM's git workspace: the clone of the user's
// repository that is shared into the VM, its remotes, who owns it
// (Ownership), the check for work that exists only there before it is
// destroyed, and Sync, which fetches the VM's branch from it into the
// user's repository.
//
// The workspace is writable by the agent inside the VM, so its .git (config,
// hooks, attributes) is untrusted on the host: git run inside it could be
// told to execute arbitrary commands (core.fsmonitor, filter drivers, hooks,
// remote.*.uploadpack, a partial clone's promisor remote ...). Every git
// command this package runs in a workspace goes through untrusted(), which
// disables those paths, but Sync's upload-pack, which carries the same
// hardening; nothing here ever fetches or pushes from inside the workspace.
package gitws

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// Git runs git through an execx.Runner.
type Git struct {
	run execx.Runner
}

// New returns a Git that runs git with run.
func New(run execx.Runner) *Git { return &Git{run: run} }

// baseEnv makes git's output stable and never interactive.
func baseEnv() []string {
	return []string{"LC_ALL=C", "GIT_TERMINAL_PROMPT=0", "GIT_PAGER=cat", "GIT_OPTIONAL_LOCKS=0"}
}

// git runs git in dir (a trusted repository: the user's own).
func (g *Git) git(ctx context.Context, dir string, args ...string) (string, error) {
	return g.gitEnv(ctx, dir, nil, args...)
}

// gitEnv is git with env added to baseEnv.
func (g *Git) gitEnv(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	res, err := g.run.Run(ctx, execx.Cmd{Path: "git", Args: append([]string{"-C", dir}, args...), Env: append(baseEnv(), env...)})
	if err != nil {
		var ee *execx.Error
		if errors.As(err, &ee) && ee.ExitCode == -1 && strings.Contains(ee.Err.Error(), "executable file not found") {
			return "", fmt.Errorf("git is not installed (hint: install it, e.g. `apt-get install git`)")
		}
		return "", err
	}
	return strings.TrimRight(string(res.Stdout), "\n"), nil
}

// Toplevel returns the root of the git checkout that contains dir.
func (g *Git) Toplevel(ctx context.Context, dir string) (string, error) {
	out, err := g.git(ctx, dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return "", fmt.Errorf("%s is not inside a git repository (hint: run agent-vm in your project's checkout, or pass --repo DIR): %w", dir, err)
	}
	return out, nil
}

// Where returns the root of the git checkout that contains dir and its
// RepoID, with one git run (Toplevel and RepoID run git once each).
func (g *Git) Where(ctx context.Context, dir string) (top, repoID string, err error) {
	out, err := g.git(ctx, dir, "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-common-dir")
	top, common, ok := strings.Cut(out, "\n")
	if err != nil || !ok {
		return "", "", fmt.Errorf("%s is not inside a git repository: %w", dir, errors.Join(err, errors.New("git printed no common dir")))
	}
	if real, err := filepath.EvalSymlinks(common); err == nil {
		common = real
	}
	return top, common, nil
}

// MaybeInside reports whether dir could be inside a git checkout: dir or a
// parent has a .git entry (a directory, or the file of a worktree), or
// GIT_DIR names one. When it is false, git finds no checkout there either
// (its discovery looks for the same entries, and GIT_CEILING_DIRECTORIES
// and filesystem boundaries only stop it earlier), so callers need not run
// git to learn that. getenv nil means os.Getenv.
func MaybeInside(dir string, getenv func(string) string) bool {
	if getenv == nil {
		getenv = os.Getenv
	}
	if getenv("GIT_DIR") != "" {
		return true
	}
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			return true
		}
		if filepath.Dir(d) == d {
			return false
		}
	}
}

// RepoID names the repository that contains dir, the same for all its
// worktrees: the absolute path of its common git directory (for a plain
// checkout, <toplevel>/.git), with symlinks resolved.
func (g *Git) RepoID(ctx context.Context, dir string) (string, error) {
	out, err := g.git(ctx, dir, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return "", fmt.Errorf("%s is not inside a git repository: %w", dir, err)
	}
	if real, err := filepath.EvalSymlinks(out); err == nil {
		out = real
	}
	return out, nil
}

// CurrentBranch returns the branch checked out in repo.
func (g *Git) CurrentBranch(ctx context.Context, repo string) (string, error) {
	out, err := g.git(ctx, repo, "symbolic-ref", "--quiet", "--short", "HEAD")
	if err != nil || out == "" {
		return "", fmt.Errorf("%s is not on a branch (detached HEAD) (hint: pass --branch NAME)", repo)
	}
	return out, nil
}

// CheckBranchName asks git whether name is a valid branch name.
func (g *Git) CheckBranchName(ctx context.Context, name string) error {
	if strings.HasPrefix(name, "-") {
		return fmt.Errorf("invalid branch name %q: it starts with '-' (hint: choose a name git accepts, e.g. feature/x)", name)
	}
	res, err := g.run.Run(ctx, execx.Cmd{Path: "git", Args: []string{"check-ref-format", "--branch", name}, Env: baseEnv()})
	// --branch also expands shorthands such as "@" and "@{-1}"; a name that
	// does not come back unchanged is one of those, not a branch name.
	if err != nil && execx.ExitCode(err) <= 0 {
		return err
	}
	if err != nil || strings.TrimSpace(string(res.Stdout)) != name {
		return fmt.Errorf("invalid branch name %q: git does not accept it as a branch (hint: see `git help check-ref-format`; e.g. no spaces, '..', '~', '^', ':' or a trailing '.lock')", name)
	}
	return nil
}

// Remotes are the workspace's remotes after Clone.
type Remotes struct {
	Origin   string // file:// URL of the source repository
	Upstream string // the source's own origin, "" when it has none
}

// CloneOptions says what to clone where.
type CloneOptions struct {
	Source string // the user's repository (its top level)
	Dest   string // the workspace directory; must not exist
	Branch string // the branch to check out
	From   string // start point when Branch does not exist yet; "" = HEAD
}

// Clone makes the workspace: a full copy of Source (no hard links: the agent
// must not be able to reach the source's object files) with Branch checked
// out, created from From (or the source's origin/<branch>, or HEAD) when the
// source has no such branch. origin points at the source as a file:// URL and
// upstream at the source's own origin.
func (g *Git) Clone(ctx context.Context, o CloneOptions) (Remotes, error) {
	exists, start, startRef, err := g.plan(ctx, o)
	if err != nil {
		return Remotes{}, err
	}
	args := []string{"clone", "--quiet", "--no-hardlinks", "--origin", "origin"}
	if exists {
		args = append(args, "--branch", o.Branch)
	} else {
		args = append(args, "--no-checkout")
	}
	args = append(args, "--", o.Source, o.Dest)
	if _, err := g.run.Run(ctx, execx.Cmd{Path: "git", Args: args, Env: baseEnv()}); err != nil {
		return Remotes{}, fmt.Errorf("cloning %s: %w", o.Source, err)
	}
	if !exists {
		if err := g.checkoutNew(ctx, o, start, startRef); err != nil {
			return Remotes{}, err
		}
	}
	return g.setRemotes(ctx, o)
}

// plan says whether Branch exists in the source and, when it does not,
// where it starts (startPoint).
func (g *Git) plan(ctx context.Context, o CloneOptions) (exists bool, start, startRef string, err error) {
	exists = g.refExists(ctx, o.Source, "refs/heads/"+o.Branch)
	if exists && o.From != "" {
		return false, "", "", fmt.Errorf("branch %q already exists in %s, so --from %q would be ignored (hint: drop --from to use the existing branch, or choose a new branch name)", o.Branch, o.Source, o.From)
	}
	if !exists {
		start, startRef, err = g.startPoint(ctx, o)
	}
	return exists, start, startRef, err
}

// startPoint resolves where a new branch starts, in the source repository.
func (g *Git) startPoint(ctx context.Context, o CloneOptions) (sha, fullRef string, err error) {
	from := o.From
	if from == "" {
		if g.refExists(ctx, o.Source, "refs/remotes/origin/"+o.Branch) {
			from = "refs/remotes/origin/" + o.Branch
		} else {
			from = "HEAD"
		}
	}
	sha, err = g.git(ctx, o.Source, "rev-parse", "--verify", "--quiet", "--end-of-options", from+"^{commit}")
	if err != nil || sha == "" {
		if from == "HEAD" {
			return "", "", fmt.Errorf("%s has no commits yet, so there is nothing to start branch %q from (hint: make a first commit)", o.Source, o.Branch)
		}
		return "", "", fmt.Errorf("--from %q is not a commit in %s (hint: use a branch, tag or commit that exists there; `git -C %s log --oneline` lists commits)", o.From, o.Source, o.Source)
	}
	fullRef, _ = g.git(ctx, o.Source, "rev-parse", "--symbolic-full-name", "--end-of-options", from)
	return sha, fullRef, nil
}

// checkoutNew creates the branch in the fresh clone at sha. A start point the
// clone did not copy (e.g. the source's own remote-tracking branch) is
// fetched from the source first; the clone is still ours alone, so running
// git in it is safe here.
func (g *Git) checkoutNew(ctx context.Context, o CloneOptions, sha, fullRef string) error {
	if _, err := g.git(ctx, o.Dest, "cat-file", "-e", sha+"^{commit}"); err != nil {
		src := sha
		if fullRef != "" && strings.HasPrefix(fullRef, "refs/") {
			src = fullRef
		}
		if _, err := g.git(ctx, o.Dest, "fetch", "--quiet", "--no-tags", "origin", src); err != nil {
			return fmt.Errorf("fetching start point %s from %s: %w", src, o.Source, err)
		}
	}
	if _, err := g.git(ctx, o.Dest, "checkout", "--quiet", "-b", o.Branch, sha); err != nil {
		return fmt.Errorf("creating branch %q in the workspace: %w", o.Branch, err)
	}
	return nil
}

// remotes are the workspace's remotes for a clone of source.
func (g *Git) remotes(ctx context.Context, source string) Remotes {
	r := Remotes{Origin: fileURL(source)}
	if up, err := g.git(ctx, source, "remote", "get-url", "origin"); err == nil && up != "" {
		r.Upstream = absRemote(source, up)
	} // else the source has no origin: no upstream
	return r
}

func (g *Git) setRemotes(ctx context.Context, o CloneOptions) (Remotes, error) {
	r := g.remotes(ctx, o.Source)
	if _, err := g.git(ctx, o.Dest, "remote", "set-url", "origin", r.Origin); err != nil {
		return Remotes{}, fmt.Errorf("setting the workspace's origin: %w", err)
	}
	if r.Upstream == "" {
		return r, nil
	}
	if _, err := g.git(ctx, o.Dest, "remote", "add", "upstream", r.Upstream); err != nil {
		return Remotes{}, fmt.Errorf("adding the workspace's upstream remote: %w", err)
	}
	return r, nil
}

// ReadAt reads path in commit rev of the user's repository repo (git
// reads the object; nothing is checked out or run): found is false when
// the commit has no such file. A blob over limit bytes is an error.
func (g *Git) ReadAt(ctx context.Context, repo, rev, path string, limit int64) (raw []byte, found bool, err error) {
	obj := rev + ":" + path
	size, err := g.git(ctx, repo, "cat-file", "-s", obj)
	if err != nil {
		return nil, false, nil // no such file in that commit
	}
	if n, err := strconv.ParseInt(size, 10, 64); err != nil || n > limit {
		return nil, true, fmt.Errorf("%s in %s: %s bytes, more than %d", path, rev, size, limit)
	}
	res, err := g.run.Run(ctx, execx.Cmd{Path: "git", Args: []string{"-C", repo, "cat-file", "blob", obj}, Env: baseEnv()})
	if err != nil {
		return nil, true, err
	}
	return res.Stdout, true, nil
}

// HasBranch reports whether the repository repo (the user's, trusted) has
// a local branch called branch.
func (g *Git) HasBranch(ctx context.Context, repo, branch string) bool {
	return g.refExists(ctx, repo, "refs/heads/"+branch)
}

func (g *Git) refExists(ctx context.Context, repo, ref string) bool {
	_, err := g.git(ctx, repo, "rev-parse", "--verify", "--quiet", ref)
	return err == nil
}

// fileURL turns an absolute path into a file:// URL.
func fileURL(path string) string {
	return "file://" + filepath.ToSlash(path)
}

// absRemote makes a remote given as a relative local path absolute (it was
// relative to the source repository, and the workspace lives elsewhere).
// URLs and scp-like addresses are returned unchanged.
func absRemote(repo, remote string) string {
	if strings.Contains(remote, "://") || filepath.IsAbs(remote) {
		return remote
	}
	if i := strings.Index(remote, ":"); i > 0 && !strings.Contains(remote[:i], "/") {
		return remote // user@host:path
	}
	return filepath.Clean(filepath.Join(repo, remote))
}

// IsRepo reports whether dir holds a git directory of its own (.git is a
// real directory, not a file or symlink pointing elsewhere).
func IsRepo(dir string) bool {
	fi, err := os.Lstat(filepath.Join(dir, ".git"))
	return err == nil && fi.IsDir()
}
