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

// TestForkCopiesTheWorkspaceAsItIs: a fork's workspace has the source's
// commits, its uncommitted change, its untracked and ignored files and its
// links as links, each file a copy of its own; it is on the new branch at
// the source's HEAD with the change still a change; the source is as it
// was; what cannot be copied is named; and the workspace's own hooks and
// filters never run.
func TestForkCopiesTheWorkspaceAsItIs(t *testing.T) {
	ctx := context.Background()
	src := tu.Repo(t, false)
	ws, _, err := clone(t, src, "feature", "")
	if err != nil {
		t.Fatal(err)
	}
	tu.WriteFile(t, filepath.Join(ws, ".gitignore"), "build/\n")
	tu.Git(t, ws, "add", ".gitignore")
	tu.Git(t, ws, "commit", "--quiet", "-m", "ignore build")
	head := tu.Git(t, ws, "rev-parse", "HEAD")
	tu.WriteFile(t, filepath.Join(ws, "README.md"), "hello\nchanged, not committed\n")
	tu.WriteFile(t, filepath.Join(ws, "notes.txt"), "untracked\n")
	tu.WriteFile(t, filepath.Join(ws, "build", "out.bin"), "ignored\n")
	if err := os.Symlink("/etc/passwd", filepath.Join(ws, "outside")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(ws, "build", "pipe"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(ws, "notes.txt"), 0o640); err != nil {
		t.Fatal(err)
	}
	// What a checkout in the copy would run, were there one.
	marker := filepath.Join(t.TempDir(), "ran")
	tu.WriteFile(t, filepath.Join(ws, ".git", "hooks", "post-checkout"), "#!/bin/sh\ntouch "+marker+"\n")
	if err := os.Chmod(filepath.Join(ws, ".git", "hooks", "post-checkout"), 0o755); err != nil {
		t.Fatal(err)
	}

	dest := filepath.Join(t.TempDir(), "fork")
	g := New(execx.OS{})
	res, err := g.Copy(ctx, ws, dest)
	if err != nil {
		t.Fatal(err)
	}
	start, err := g.Branch(ctx, dest, "feature-b")
	if err != nil {
		t.Fatal(err)
	}
	if start != head || res.Commit != head {
		t.Errorf("the fork starts at %s (copied at %s), want the source's HEAD %s", start, res.Commit, head)
	}
	if got := tu.Git(t, dest, "branch", "--show-current"); got != "feature-b" {
		t.Errorf("the fork is on %q, want feature-b", got)
	}
	if got := tu.Git(t, dest, "rev-parse", "HEAD"); got != head {
		t.Errorf("the fork's HEAD is %s, want %s", got, head)
	}
	if got := tu.Git(t, dest, "status", "--porcelain"); !strings.Contains(got, "M README.md") || !strings.Contains(got, "?? notes.txt") {
		t.Errorf("the fork's status should keep the change and the untracked file:\n%s", got)
	}
	if got := tu.Git(t, ws, "branch", "--show-current"); got != "feature" {
		t.Errorf("the source moved to %q", got)
	}
	for _, f := range []string{"README.md", "notes.txt", "build/out.bin"} {
		a, b := filepath.Join(ws, f), filepath.Join(dest, f)
		want, _ := os.ReadFile(a)
		got, err := os.ReadFile(b)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s in the fork: %q, %v; want %q", f, got, err, want)
		}
		sa, _ := os.Stat(a)
		sb, _ := os.Stat(b)
		if sb != nil && os.SameFile(sa, sb) {
			t.Errorf("%s in the fork is the source's file, not a copy", f)
		}
		if sb != nil && (sa.Mode() != sb.Mode() || !sa.ModTime().Equal(sb.ModTime())) {
			t.Errorf("%s: mode %v time %v in the fork, want %v %v", f, sb.Mode(), sb.ModTime(), sa.Mode(), sa.ModTime())
		}
	}
	if target, err := os.Readlink(filepath.Join(dest, "outside")); err != nil || target != "/etc/passwd" {
		t.Errorf("the link should be copied as a link: %q, %v", target, err)
	}
	if len(res.Skipped) != 1 || res.Skipped[0] != filepath.Join("build", "pipe") {
		t.Errorf("skipped %q, want the FIFO alone", res.Skipped)
	}
	if res.Files < 4 || res.Bytes == 0 {
		t.Errorf("counted %d files, %d bytes", res.Files, res.Bytes)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("a hook of the workspace ran on the host")
	}
	// The fork diverges from here: a commit in it is not the source's.
	tu.Git(t, dest, "-c", "core.hooksPath=/dev/null", "commit", "--quiet", "-am", "in the fork")
	if got := tu.Git(t, ws, "rev-parse", "HEAD"); got != head {
		t.Errorf("a commit in the fork moved the source to %s", got)
	}
}

func TestForkRefuses(t *testing.T) {
	ctx := context.Background()
	g := New(execx.OS{})
	src := tu.Repo(t, false)
	ws, _, err := clone(t, src, "feature", "")
	if err != nil {
		t.Fatal(err)
	}
	taken := filepath.Join(t.TempDir(), "taken")
	if err := os.Mkdir(taken, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, ws, dest, branch, want string
	}{
		{"an invalid branch", ws, filepath.Join(t.TempDir(), "a"), "bad..name", "invalid branch name"},
		{"a branch the workspace has", ws, filepath.Join(t.TempDir(), "b"), "feature", `has a branch "feature" already`},
		{"a destination that exists", ws, taken, "other", "exists already"},
		{"a workspace that is no repository", t.TempDir(), filepath.Join(t.TempDir(), "c"), "other", "no .git directory of its own"},
	} {
		_, err := g.Copy(ctx, c.ws, c.dest)
		if err == nil {
			_, err = g.Branch(ctx, c.dest, c.branch)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
		if strings.Contains(c.name, "no repository") {
			if _, serr := os.Lstat(c.dest); serr == nil {
				t.Errorf("%s: the refused copy left %s behind", c.name, c.dest)
			}
		}
	}
	if _, err := os.Stat(taken); err != nil {
		t.Errorf("a refused fork removed the existing %s: %v", taken, err)
	}
}

// Copy copies a workspace exactly, its branch and changes as they are,
// and says its HEAD; a workspace on an unborn branch copies too, without
// one.
func TestCopyKeepsTheWorkspaceAsItIs(t *testing.T) {
	ctx := context.Background()
	src := tu.Repo(t, false)
	ws, _, err := clone(t, src, "feature", "")
	if err != nil {
		t.Fatal(err)
	}
	tu.WriteFile(t, filepath.Join(ws, "notes.txt"), "untracked\n")
	dest := filepath.Join(t.TempDir(), "copy")
	res, err := New(execx.OS{}).Copy(ctx, ws, dest)
	if err != nil {
		t.Fatal(err)
	}
	if got := tu.Git(t, dest, "branch", "--show-current"); got != "feature" || res.Commit != tu.Git(t, ws, "rev-parse", "HEAD") {
		t.Errorf("the copy is on %q at %s; want feature at the workspace's HEAD", got, res.Commit)
	}
	if got, _ := os.ReadFile(filepath.Join(dest, "notes.txt")); string(got) != "untracked\n" {
		t.Errorf("notes.txt in the copy: %q", got)
	}
	if _, err := New(execx.OS{}).Copy(ctx, ws, dest); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("a copy onto an existing directory: %v", err)
	}

	empty := filepath.Join(t.TempDir(), "empty")
	tu.Git(t, filepath.Dir(empty), "init", "--quiet", empty)
	res, err = New(execx.OS{}).Copy(ctx, empty, filepath.Join(t.TempDir(), "copy"))
	if err != nil || res.Commit != "" {
		t.Errorf("the copy of an unborn branch: %+v, %v; want it copied, without a commit", res, err)
	}
}
