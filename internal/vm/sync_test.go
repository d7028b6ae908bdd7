package vm_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// These tests make a stopped VM's directory by hand, its workspace a real
// clone as create makes it; nothing boots. sync and destroy are real.

// stoppedVM makes the directory of a stopped qemu VM for branch of a new
// repository, and returns that repository and the VM's workspace.
func stoppedVM(t *testing.T, m *vm.Manager, branch string) (src, ws string) {
	t.Helper()
	ctx := context.Background()
	src = tu.Repo(t, true)
	id, err := m.Git.RepoID(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	_, l := vmDir(t, m, branch, state.Git{Source: src, Repo: id}, func(ws string) {
		if _, err := m.Git.Clone(ctx, gitws.CloneOptions{Source: src, Dest: ws, Branch: branch}); err != nil {
			t.Fatal(err)
		}
	})
	return src, l.Workspace()
}

// After sync, the agent's commits are in the user's repository, and
// destroy no longer refuses for them.
func TestSyncThenDestroyWithoutForce(t *testing.T) {
	m := plainManager(t)
	ctx := context.Background()
	src, ws := stoppedVM(t, m, "feature/x")
	tu.WriteFile(t, filepath.Join(ws, "a.txt"), "a\n")
	tu.Git(t, ws, "add", "a.txt")
	tu.Git(t, ws, "commit", "--quiet", "-m", "agent work")
	tip := tu.Git(t, ws, "rev-parse", "HEAD")

	_, err := m.Destroy(ctx, "feature/x", false)
	var unsaved *vm.UnsavedError
	if !errors.As(err, &unsaved) || !strings.Contains(err.Error(), "agent-vm sync feature-x") {
		t.Fatalf("destroy before sync: want a refusal offering `agent-vm sync feature-x`, got %v", err)
	}
	res, err := m.Sync(ctx, "feature/x")
	if err != nil {
		t.Fatal(err)
	}
	if res.Ref != "refs/remotes/agent-vm/feature/x" || res.New != tip || res.Commits != 1 {
		t.Errorf("sync: got %+v, want %s at %s", *res, "refs/remotes/agent-vm/feature/x", tip)
	}
	if _, err := m.Destroy(ctx, "feature/x", false); err != nil {
		t.Fatalf("destroy after sync: %v", err)
	}
	if got := tu.Git(t, src, "rev-parse", "refs/remotes/agent-vm/feature/x"); got != tip {
		t.Errorf("after destroy the source's ref is at %s, want %s", got, tip)
	}
}

// Each refusal names what it was given and what to do, and writes nothing
// to the user's repository.
func TestSyncRefusals(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, ws string)
		vm    string
		want  []string
	}{
		{"unknown VM", func(*testing.T, string) {}, "nope", []string{`"nope"`, "agent-vm list"}},
		{"workspace gone", func(t *testing.T, ws string) { os.RemoveAll(ws) }, "feat",
			[]string{"feat", "is gone", "agent-vm destroy feat"}},
		{"workspace not a git repository", func(t *testing.T, ws string) { os.RemoveAll(filepath.Join(ws, ".git")) }, "feat",
			[]string{"feat", "WS", "not a git repository", "hint:"}},
		{"branch deleted", func(t *testing.T, ws string) {
			tu.Git(t, ws, "checkout", "--quiet", "-b", "elsewhere")
			tu.Git(t, ws, "branch", "-D", "feat")
		}, "feat", []string{`no branch "feat"`, "elsewhere", "main", "hint:"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := plainManager(t)
			src, ws := stoppedVM(t, m, "feat")
			c.setup(t, ws)
			_, err := m.Sync(context.Background(), c.vm)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), strings.ReplaceAll(w, "WS", ws)) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if got := tu.Git(t, src, "for-each-ref", gitws.SyncRefs); got != "" {
				t.Errorf("a refused sync wrote to the source: %s", got)
			}
		})
	}
}
