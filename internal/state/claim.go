package state

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// A new VM's name: the branch's slug, or with a short hash of the
// repository when another repository's VM has that.

// ErrExists means a VM for that branch already exists, or its name is
// taken by another branch of the same repository.
var ErrExists = errors.New("already exists")

// Claim picks the name of the new VM for branch of repo and takes that
// name's lock: the branch's slug, or, when a VM of another repository has
// that, the slug with a short hash of the repository (RepoSlug). It
// refuses (ErrExists) when repo already has a VM for branch, or another of
// its branches maps to the same slug. entries are the VMs there are, with
// their repositories; fill completes an old record that has none, read
// again under the lock.
func (r *Root) Claim(ctx context.Context, branch, repo string, entries []Entry, fill func(Entry)) (string, *Lock, error) {
	base, err := Slug(branch)
	if err != nil {
		return "", nil, err
	}
	// A VM made while another repository held the plain slug keeps the
	// hashed one after that VM is gone; look for it by branch first.
	for _, e := range entries {
		if e.Record != nil && e.Record.Branch == branch && e.Record.Git.Repo == repo {
			return "", nil, existsError(branch, e.Slug)
		}
	}
	for _, slug := range []string{base, RepoSlug(base, repo)} {
		lock, err := r.LockVM(ctx, slug)
		if err != nil {
			return "", nil, err
		}
		err = r.checkFree(branch, repo, slug, fill)
		if err == nil {
			return slug, lock, nil
		}
		lock.Release()
		if !errors.Is(err, errOtherRepo) {
			return "", nil, err
		}
	}
	return "", nil, fmt.Errorf("the VM names %q and %q are both taken by other repositories' VMs (hint: `agent-vm list` shows them; destroy one, or use another branch name)", base, RepoSlug(base, repo))
}

// errOtherRepo: the slug belongs to a VM of another repository.
var errOtherRepo = errors.New("the name is another repository's")

// checkFree refuses a slug that is taken, by this branch of repo (already
// exists) or by another of its branches (the slugs collide); a slug of
// another repository's VM is errOtherRepo. The caller holds the VM lock.
func (r *Root) checkFree(branch, repo, slug string, fill func(Entry)) error {
	l := r.Layout(slug)
	if _, err := os.Lstat(l.Dir); os.IsNotExist(err) {
		return nil
	}
	rec, err := ReadRecord(l.Record())
	if err != nil {
		return fmt.Errorf("VM directory %s already exists but is unreadable: %v (hint: `agent-vm destroy %s --force` removes it): %w", l.Dir, err, slug, ErrExists)
	}
	if rec.Git.Repo == "" && fill != nil {
		fill(Entry{Slug: slug, Layout: l, Record: rec})
	}
	switch {
	case rec.Git.Repo != repo:
		return errOtherRepo
	case rec.Branch == branch:
		return existsError(branch, slug)
	default:
		return fmt.Errorf("branch %q would use the VM name %q, which branch %q already uses (hint: destroy that VM first, or use a branch name that differs in more than case and punctuation): %w", branch, slug, rec.Branch, ErrExists)
	}
}

func existsError(branch, slug string) error {
	return fmt.Errorf("a VM for branch %q of this repository already exists (hint: `agent-vm start %s` starts it; `agent-vm destroy %s` removes it): %w", branch, slug, slug, ErrExists)
}

// RepoSlug is the VM name for branch in a repository whose VM for another
// repository already has the branch's own slug: the slug with a short hash
// of the repository, which stays the same for that repository.
func RepoSlug(slug, repo string) string {
	sum := sha256.Sum256([]byte(repo))
	suffix := "-" + hex.EncodeToString(sum[:])[:6]
	if len(slug)+len(suffix) > MaxSlugLen {
		slug = strings.TrimRight(slug[:MaxSlugLen-len(suffix)], "-")
	}
	return slug + suffix
}
