package state

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// Claim gives a branch its slug; another repository's VM on that slug
// moves the new VM to the hashed name; a VM of the same repository for
// the branch, or for another branch with the same slug, is ErrExists; an
// old record without a repository is filled in before it is judged.
func TestClaim(t *testing.T) {
	ctx := context.Background()
	root, err := Open(top(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	put := func(slug, branch, repo string) {
		t.Helper()
		l := root.Layout(slug)
		if err := os.MkdirAll(l.Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		rec := sampleRecord(branch)
		rec.Slug, rec.Git.Repo = slug, repo
		if err := WriteRecord(l.Record(), rec); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(branch, repo string, fill func(Entry)) (string, error) {
		t.Helper()
		entries, err := root.List()
		if err != nil {
			t.Fatal(err)
		}
		slug, lock, err := root.Claim(ctx, branch, repo, entries, fill)
		if err == nil {
			lock.Release()
		}
		return slug, err
	}

	if slug, err := claim("feature/x", "repo-a", nil); err != nil || slug != "feature-x" {
		t.Fatalf("a free name: %q, %v; want feature-x", slug, err)
	}
	put("feature-x", "feature/x", "repo-a")
	if _, err := claim("feature/x", "repo-a", nil); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "agent-vm start feature-x") {
		t.Errorf("the same branch again: %v; want ErrExists naming start", err)
	}
	if _, err := claim("Feature-X", "repo-a", nil); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), `branch "feature/x" already uses`) {
		t.Errorf("another branch on the same slug: %v; want ErrExists naming feature/x", err)
	}
	hashed := RepoSlug("feature-x", "repo-b")
	if slug, err := claim("feature/x", "repo-b", nil); err != nil || slug != hashed {
		t.Errorf("another repository: %q, %v; want %q", slug, err, hashed)
	}
	put(hashed, "feature/x", "repo-b")
	if _, err := claim("feature/x", "repo-b", nil); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), hashed) {
		t.Errorf("the other repository's branch again: %v; want ErrExists naming %s", err, hashed)
	}
	put(RepoSlug("feature-x", "repo-c"), "feature-x", "repo-d") // as a collision of the short hash would
	if _, err := claim("feature/x", "repo-c", nil); err == nil || !strings.Contains(err.Error(), "both taken") {
		t.Errorf("both names taken: %v; want a refusal naming both", err)
	}

	put("old", "old", "")
	filled := 0
	_, err = claim("old", "repo-a", func(e Entry) { filled++; e.Record.Git.Repo = "repo-a" })
	if filled != 1 || !errors.Is(err, ErrExists) {
		t.Errorf("an old record: filled %d times, %v; want once, then ErrExists for the same repository", filled, err)
	}
	if n := len(RepoSlug(strings.Repeat("a", MaxSlugLen), "r")); n > MaxSlugLen {
		t.Errorf("RepoSlug of a long slug has %d characters; want at most %d", n, MaxSlugLen)
	}
}
