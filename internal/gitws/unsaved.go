package gitws

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Commit is a commit that exists only in the workspace.
type Commit struct {
	// Ref is the local ref it was found on: "HEAD" when detached, else a
	// full ref name (refs/heads/x, refs/tags/keep, refs/notes/commits ...).
	Ref     string
	Hash    string // abbreviated
	Subject string
}

// Unsaved is the work in a workspace (or one of its submodules) that would
// be lost with it. Its strings come from the workspace as they are; Report
// escapes them for a terminal.
type Unsaved struct {
	Changed   []string // "XY path" for tracked files with changes, staged or not
	Untracked []string // untracked, not ignored
	Ignored   []string // git-ignored; a directory wholly ignored is one entry ending in "/"
	Stashes   []string // "stash@{0}: ..."
	Unpushed  []Commit // on local refs, reachable from no remote
	// Submodules are the submodules with unsaved work or risky settings of
	// their own.
	Submodules []Submodule
	// Risky lists workspace git settings that make git on the host run
	// commands: a warning for whoever runs git there by hand.
	Risky []string
	// ForeignOwner: the workspace belongs to another user (the guest uid,
	// when agent-vm runs as root), so git needs safe.directory there.
	ForeignOwner bool
}

// Submodule is the unsaved work inside one submodule.
type Submodule struct {
	Path string // relative to the repository that has it
	Unsaved
}

// Empty reports whether nothing would be lost (risky settings are a
// warning, not work).
func (u *Unsaved) Empty() bool {
	for _, s := range u.Submodules {
		if !s.Empty() {
			return false
		}
	}
	return len(u.Changed) == 0 && len(u.Untracked) == 0 && len(u.Ignored) == 0 && len(u.Stashes) == 0 &&
		len(u.Unpushed) == 0
}

// maxDepth bounds how deep submodules of submodules are followed.
const maxDepth = 8

// Inspect finds the work in ws that exists nowhere else, submodules
// included. source, when not empty, is the repository the workspace was
// cloned from: commits that reached it some other way than a push from the
// workspace count as saved.
func (g *Git) Inspect(ctx context.Context, ws, source string) (*Unsaved, error) {
	root, err := realWorkspace(ws)
	if err != nil {
		return nil, err
	}
	in := inspection{g: g, root: root, seen: map[string]bool{}}
	u, err := in.repo(ctx, repo{work: root, gitDir: filepath.Join(root, ".git")}, source, 0)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(ws); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
			u.ForeignOwner = true
		}
	}
	return u, nil
}

// realWorkspace is ws with symlinks resolved, absolute; it must hold a
// .git directory of its own.
func realWorkspace(ws string) (string, error) {
	if !IsRepo(ws) {
		return "", fmt.Errorf("%s has no .git directory of its own; refusing to run git there", ws)
	}
	root, err := filepath.EvalSymlinks(ws)
	if err == nil {
		root, err = filepath.Abs(root)
	}
	if err != nil {
		return "", fmt.Errorf("resolving the workspace %s: %w", ws, err)
	}
	return root, nil
}

// inspection is one Inspect: the workspace's real path, which every
// submodule must lie in, and the git directories already looked at.
type inspection struct {
	g    *Git
	root string
	seen map[string]bool
}

// repo inspects one repository of the workspace and, recursively, its
// submodules.
func (in *inspection) repo(ctx context.Context, r repo, source string, depth int) (*Unsaved, error) {
	in.seen[r.gitDir] = true
	where := in.root
	if r.path != "" {
		where = fmt.Sprintf("the submodule %s", termsafe.String(r.path))
	}
	g := in.g
	u := &Unsaved{}
	// --ignore-submodules=dirty: a submodule whose HEAD moved shows as
	// changed, read from its refs; its own files are looked at below, by
	// git run there with hardening, never by a git that status would start.
	status, err := g.untrusted(ctx, r, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=dirty")
	if err != nil {
		return nil, fmt.Errorf("checking %s for uncommitted work: %w", where, err)
	}
	u.Changed, u.Untracked, _ = parseStatus(status)
	// Ignored files: directories that are ignored as a whole collapsed to
	// one entry (node_modules/), so a huge one costs one line.
	ignored, err := g.untrusted(ctx, r, "status", "--porcelain=v1", "-z", "--untracked-files=normal", "--ignored=matching", "--ignore-submodules=all")
	if err != nil {
		return nil, fmt.Errorf("checking %s for ignored files: %w", where, err)
	}
	_, _, u.Ignored = parseStatus(ignored)
	stashes, err := g.untrusted(ctx, r, "stash", "list", "--format=%gd: %gs")
	if err != nil {
		return nil, fmt.Errorf("listing stashes in %s: %w", where, err)
	}
	u.Stashes = lines(stashes)
	if u.Unpushed, err = g.unpushed(ctx, r, source); err != nil {
		return nil, fmt.Errorf("checking %s for unpushed commits: %w", where, err)
	}
	u.Risky = g.risky(ctx, r)
	if err := in.submodules(ctx, r, u, source, depth); err != nil {
		return nil, err
	}
	return u, nil
}

// parseStatus splits `git status --porcelain=v1 -z` into changed tracked
// paths ("XY path"), untracked paths and ignored paths.
func parseStatus(out string) (changed, untracked, ignored []string) {
	fields := strings.Split(out, "\x00")
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if len(f) < 4 {
			continue
		}
		xy, path := f[:2], f[3:]
		switch {
		case xy == "??":
			untracked = append(untracked, path)
		case xy == "!!":
			ignored = append(ignored, path)
		default:
			changed = append(changed, xy+" "+path)
			if xy[0] == 'R' || xy[0] == 'C' {
				i++ // the next field is the rename's source
			}
		}
	}
	return changed, untracked, ignored
}

func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// DropSaved removes from u's commits (not its submodules') those whose
// objects the repository source has: for a workspace inspected elsewhere
// (on a VM's host, without the source), once its branch was fetched into
// source, they are saved there. Hashes are the abbreviated ones Inspect
// gives; git resolves each in source, and one it cannot resolve (absent,
// or ambiguous) stays unsaved.
func (g *Git) DropSaved(ctx context.Context, u *Unsaved, source string) {
	kept := u.Unpushed[:0]
	for _, c := range u.Unpushed {
		if _, err := g.git(ctx, source, "rev-parse", "--verify", "--quiet", "--end-of-options", c.Hash+"^{commit}"); err != nil {
			kept = append(kept, c)
		}
	}
	u.Unpushed = kept
}
