package gitws

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// Where answers with one git run what Toplevel and RepoID answer with two,
// from a subdirectory and from a linked worktree (same repository, its own
// top level).
func TestWhereMatchesToplevelAndRepoID(t *testing.T) {
	ctx := context.Background()
	g := New(execx.OS{})
	src := tu.Repo(t, true)
	sub := filepath.Join(src, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	wt := filepath.Join(t.TempDir(), "wt")
	tu.Git(t, src, "worktree", "add", "--quiet", "-b", "other", wt)
	for _, dir := range []string{src, sub, wt} {
		top, id, err := g.Where(ctx, dir)
		if err != nil {
			t.Fatalf("Where(%s): %v", dir, err)
		}
		wantTop, err1 := g.Toplevel(ctx, dir)
		wantID, err2 := g.RepoID(ctx, dir)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if top != wantTop || id != wantID {
			t.Errorf("Where(%s) = %q, %q; want %q, %q", dir, top, id, wantTop, wantID)
		}
	}
	if _, _, err := g.Where(ctx, t.TempDir()); err == nil {
		t.Error("Where outside any repository succeeded, want an error")
	}
}

// MaybeInside is true wherever git finds a checkout (a .git directory
// above, a worktree's .git file, GIT_DIR) and false only where git finds
// none.
func TestMaybeInside(t *testing.T) {
	g := New(execx.OS{})
	src := tu.Repo(t, true)
	wt := filepath.Join(t.TempDir(), "wt")
	tu.Git(t, src, "worktree", "add", "--quiet", "-b", "other", wt)
	outside := t.TempDir()
	noEnv := func(string) string { return "" }
	for _, c := range []struct {
		dir    string
		getenv func(string) string
		want   bool
	}{
		{filepath.Join(src, "x", "y"), noEnv, true}, // need not exist
		{wt, noEnv, true},
		{outside, noEnv, false},
		{outside, func(k string) string { return map[string]string{"GIT_DIR": filepath.Join(src, ".git")}[k] }, true},
	} {
		if got := MaybeInside(c.dir, c.getenv); got != c.want {
			t.Errorf("MaybeInside(%s) = %v, want %v", c.dir, got, c.want)
		}
		if !c.want {
			if _, err := g.Toplevel(context.Background(), c.dir); err == nil {
				t.Errorf("%s: MaybeInside says no checkout, but git finds one", c.dir)
			}
		}
	}
}
