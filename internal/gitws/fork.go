package gitws

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// ForkResult says what a workspace fork copied.
type ForkResult struct {
	// Commit is the new branch's start: the source workspace's HEAD.
	Commit string
	// Files, Bytes: the regular files copied and their size; Copied those
	// the last pass copied (all of them, but for Precopy's copies that
	// still held).
	Files  int
	Bytes  int64
	Copied int
	// Linked, LinkedBytes: of the files, those that are links to an
	// earlier copy's (Copying.Reuse), and their size.
	Linked      int
	LinkedBytes int64
	// Skipped are the entries a copy cannot carry (sockets, FIFOs, device
	// nodes), relative to the workspace: what listened or waited on them
	// is a process, which the fork's memory brings, not its files.
	Skipped []string
}

// Copy copies the workspace ws into dest, which must not exist, exactly as
// it is (Copying says what it carries), in one pass: nothing may change ws
// meanwhile. Res.Commit is ws's HEAD ("" on an unborn branch). A failure
// removes what was copied.
func (g *Git) Copy(ctx context.Context, ws, dest string) (*ForkResult, error) {
	c, err := g.NewCopying(ws, dest)
	if err != nil {
		return nil, err
	}
	res, err := c.Finish(ctx)
	if err != nil {
		return nil, err
	}
	res.Commit = g.Head(ctx, dest)
	return res, nil
}

// Head is the commit at HEAD of the workspace (or copy of one) ws, "" on
// an unborn branch or when ws is no repository.
func (g *Git) Head(ctx context.Context, ws string) string {
	r := repo{work: ws, gitDir: filepath.Join(ws, ".git")}
	head, _ := g.untrusted(ctx, r, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
	return head
}

// Branch puts the copy of a workspace at dest on a new branch at its HEAD,
// which it returns, without touching its work tree: the copy's changes
// stay changes. Nothing of the workspace runs: git runs in the copy
// hardened as everywhere here.
func (g *Git) Branch(ctx context.Context, dest, branch string) (string, error) {
	if err := g.CheckBranchName(ctx, branch); err != nil {
		return "", err
	}
	r := repo{work: dest, gitDir: filepath.Join(dest, ".git")}
	head := g.Head(ctx, dest)
	if head == "" {
		return "", fmt.Errorf("the workspace copied to %s has no commit at HEAD to fork from", dest)
	}
	if g.refExistsIn(ctx, r, "refs/heads/"+branch) {
		return "", fmt.Errorf("the workspace copied to %s has a branch %q already (hint: fork into a branch name it does not have)", dest, branch)
	}
	// update-ref and symbolic-ref write refs only: no checkout, so no
	// hook, filter or work-tree change.
	if _, err := g.untrusted(ctx, r, "update-ref", "-m", "agent-vm fork", "refs/heads/"+branch, head, ""); err != nil {
		return "", fmt.Errorf("making branch %q in the fork: %s", branch, termsafe.String(err.Error()))
	}
	if _, err := g.untrusted(ctx, r, "symbolic-ref", "HEAD", "refs/heads/"+branch); err != nil {
		return "", fmt.Errorf("putting the fork on branch %q: %s", branch, termsafe.String(err.Error()))
	}
	return head, nil
}

// refExistsIn reports whether ref exists in the workspace repository r.
func (g *Git) refExistsIn(ctx context.Context, r repo, ref string) bool {
	_, err := g.untrusted(ctx, r, "show-ref", "--verify", "--quiet", ref)
	return err == nil
}
