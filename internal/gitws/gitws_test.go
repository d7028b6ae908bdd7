package gitws

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

func clone(t *testing.T, src, branch, from string) (string, Remotes, error) {
	t.Helper()
	ws := filepath.Join(t.TempDir(), "workspace")
	r, err := New(execx.OS{}).Clone(context.Background(), CloneOptions{Source: src, Dest: ws, Branch: branch, From: from})
	return ws, r, err
}

func TestCloneExistingBranchAndRemotes(t *testing.T) {
	src := tu.Repo(t, true)
	tu.Git(t, src, "checkout", "--quiet", "-b", "feature/x")
	tu.WriteFile(t, filepath.Join(src, "f.txt"), "on feature\n")
	tu.Git(t, src, "add", ".")
	tu.Git(t, src, "commit", "--quiet", "-m", "feature work")
	tu.Git(t, src, "checkout", "--quiet", "main")

	ws, r, err := clone(t, src, "feature/x", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := tu.Git(t, ws, "symbolic-ref", "--short", "HEAD"); got != "feature/x" {
		t.Errorf("checked out %q, want feature/x", got)
	}
	if _, err := os.Stat(filepath.Join(ws, "f.txt")); err != nil {
		t.Errorf("the branch's file is missing: %v", err)
	}
	if want := "file://" + src; r.Origin != want || tu.Git(t, ws, "remote", "get-url", "origin") != want {
		t.Errorf("origin: got %q, want %q", r.Origin, want)
	}
	wantUp := filepath.Join(filepath.Dir(src), "remote.git")
	if r.Upstream != wantUp || tu.Git(t, ws, "remote", "get-url", "upstream") != wantUp {
		t.Errorf("upstream: got %q, want %q", r.Upstream, wantUp)
	}
}

func TestCloneWithoutSourceOriginHasNoUpstream(t *testing.T) {
	src := tu.Repo(t, false)
	ws, r, err := clone(t, src, "main", "")
	if err != nil {
		t.Fatal(err)
	}
	if r.Upstream != "" {
		t.Errorf("upstream %q, want none", r.Upstream)
	}
	if out := tu.Git(t, ws, "remote"); out != "origin" {
		t.Errorf("remotes: %q", out)
	}
}

func TestCloneRelativeUpstreamBecomesAbsolute(t *testing.T) {
	src := tu.Repo(t, true)
	tu.Git(t, src, "remote", "set-url", "origin", "../remote.git")
	_, r, err := clone(t, src, "main", "")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(filepath.Dir(src), "remote.git"); r.Upstream != want {
		t.Errorf("upstream %q, want %q", r.Upstream, want)
	}
}

func TestCloneNewBranchFromHeadAndFrom(t *testing.T) {
	src := tu.Repo(t, false)
	first := tu.Git(t, src, "rev-parse", "HEAD")
	tu.Git(t, src, "tag", "v1")
	tu.WriteFile(t, filepath.Join(src, "second.txt"), "2\n")
	tu.Git(t, src, "add", ".")
	tu.Git(t, src, "commit", "--quiet", "-m", "second")
	head := tu.Git(t, src, "rev-parse", "HEAD")

	ws, _, err := clone(t, src, "new-from-head", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := tu.Git(t, ws, "rev-parse", "HEAD"); got != head {
		t.Errorf("new branch at %s, want HEAD %s", got, head)
	}
	if got := tu.Git(t, ws, "symbolic-ref", "--short", "HEAD"); got != "new-from-head" {
		t.Errorf("on %q", got)
	}
	ws, _, err = clone(t, src, "new-from-tag", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if got := tu.Git(t, ws, "rev-parse", "HEAD"); got != first {
		t.Errorf("--from v1: at %s, want %s", got, first)
	}
	if tu.Git(t, src, "branch", "--list", "new-from-tag") != "" {
		t.Error("creating the workspace branch must not create it in the source")
	}
}

func TestCloneFromSourceRemoteTrackingBranch(t *testing.T) {
	src := tu.Repo(t, true)
	// Someone else pushed a branch; the source only has it as origin/shared.
	other := filepath.Join(t.TempDir(), "other")
	tu.Git(t, filepath.Dir(other), "clone", "--quiet", filepath.Join(filepath.Dir(src), "remote.git"), other)
	tu.Git(t, other, "checkout", "--quiet", "-b", "shared")
	tu.WriteFile(t, filepath.Join(other, "s.txt"), "s\n")
	tu.Git(t, other, "add", ".")
	tu.Git(t, other, "commit", "--quiet", "-m", "shared work")
	tu.Git(t, other, "push", "--quiet", "origin", "shared")
	tu.Git(t, src, "fetch", "--quiet", "origin")
	want := tu.Git(t, src, "rev-parse", "origin/shared")

	ws, _, err := clone(t, src, "shared", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := tu.Git(t, ws, "rev-parse", "HEAD"); got != want {
		t.Errorf("started at %s, want the source's origin/shared %s", got, want)
	}
	// --from naming the source's remote-tracking ref works too.
	ws, _, err = clone(t, src, "from-remote-ref", "origin/shared")
	if err != nil {
		t.Fatal(err)
	}
	if got := tu.Git(t, ws, "rev-parse", "HEAD"); got != want {
		t.Errorf("--from origin/shared: at %s, want %s", got, want)
	}
}

func TestCloneRefusals(t *testing.T) {
	src := tu.Repo(t, false)
	if _, _, err := clone(t, src, "main", "HEAD"); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("--from with an existing branch: got %v", err)
	}
	if _, _, err := clone(t, src, "x", "no-such-ref"); err == nil || !strings.Contains(err.Error(), "--from") {
		t.Errorf("bad --from: got %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	tu.Git(t, filepath.Dir(empty), "init", "--quiet", empty)
	if _, _, err := clone(t, empty, "x", ""); err == nil || !strings.Contains(err.Error(), "no commits") {
		t.Errorf("empty source: got %v", err)
	}
}

func TestCloneHasNoHardLinksIntoSource(t *testing.T) {
	src := tu.Repo(t, false)
	tu.Git(t, src, "gc", "--quiet") // objects in a pack file
	ws, _, err := clone(t, src, "main", "")
	if err != nil {
		t.Fatal(err)
	}
	packs, _ := filepath.Glob(filepath.Join(ws, ".git", "objects", "pack", "*"))
	if len(packs) == 0 {
		packs, _ = filepath.Glob(filepath.Join(ws, ".git", "objects", "??", "*"))
	}
	if len(packs) == 0 {
		t.Fatal("no object files in the workspace")
	}
	for _, p := range packs {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if n := fi.Sys().(*syscall.Stat_t).Nlink; n != 1 {
			t.Errorf("%s has %d links; the workspace must not share object files with the source", p, n)
		}
	}
}

func TestCheckBranchName(t *testing.T) {
	g := New(execx.OS{})
	for _, ok := range []string{"main", "feature/x", "fix-1.2", "user/thing_with_underscores", "ünïcode"} {
		if err := g.CheckBranchName(context.Background(), ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "a..b", "-x", "x.lock", "a:b", "a~1", "HEAD", "@{-1}", "x/", "a\nb", "a\\b"} {
		if err := g.CheckBranchName(context.Background(), bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
