package gitws

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

func sync(t *testing.T, ws, src, branch string) *SyncResult {
	t.Helper()
	res, err := New(execx.OS{}).Sync(context.Background(), ws, src, branch)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// syncedRefs lists the source's refs under SyncRefs.
func syncedRefs(t *testing.T, src string) string {
	t.Helper()
	return tu.Git(t, src, "for-each-ref", "--format=%(refname) %(objectname)", SyncRefs)
}

func TestSyncFetchesTheBranchAndForceUpdatesIt(t *testing.T) {
	src, ws := freshWorkspace(t)
	commit(t, ws, "a.txt", "agent one")
	commit(t, ws, "b.txt", "agent two")
	tip := tu.Git(t, ws, "rev-parse", "HEAD")
	res := sync(t, ws, src, "feature/x")
	want := SyncResult{Branch: "feature/x", Ref: "refs/remotes/agent-vm/feature/x", New: tip, Commits: 2}
	if !reflect.DeepEqual(*res, want) {
		t.Errorf("first sync: got %+v, want %+v", *res, want)
	}
	if got := tu.Git(t, src, "rev-parse", "refs/remotes/agent-vm/feature/x"); got != tip {
		t.Errorf("the source's ref is at %s, want %s", got, tip)
	}
	if got := tu.Git(t, src, "tag", "--list"); got != "" {
		t.Errorf("tags were fetched: %q", got)
	}

	// Again: up to date.
	if res := sync(t, ws, src, "feature/x"); res.Old != tip || res.New != tip || res.Commits != 0 || res.Forced {
		t.Errorf("second sync: got %+v, want up to date at %s", *res, tip)
	}

	// The agent rewrites its branch: the ref follows, forced.
	tu.Git(t, ws, "commit", "--quiet", "--amend", "-m", "agent two, amended")
	amended := tu.Git(t, ws, "rev-parse", "HEAD")
	want = SyncResult{Branch: "feature/x", Ref: want.Ref, Old: tip, New: amended, Commits: 1, Forced: true}
	if res := sync(t, ws, src, "feature/x"); !reflect.DeepEqual(*res, want) {
		t.Errorf("after an amend: got %+v, want %+v", *res, want)
	}

	// A fast-forward is not forced, and counts only the new commits.
	commit(t, ws, "c.txt", "agent three")
	if res := sync(t, ws, src, "feature/x"); res.Old != amended || res.Commits != 1 || res.Forced {
		t.Errorf("after a fast-forward: got %+v", *res)
	}
}

// Every hook git knows, each touching a marker of its own name.
var hookNames = []string{"applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
	"prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout", "post-merge", "pre-push",
	"pre-receive", "update", "proc-receive", "post-receive", "post-update", "reference-transaction", "push-to-checkout",
	"pre-auto-gc", "post-rewrite", "sendemail-validate", "fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist",
	"p4-post-changelist", "p4-pre-submit", "post-index-change"}

// hostileWorkspace makes a workspace (at a path that is itself an attempt
// at shell injection) whose config, hooks and attributes all try to run a
// command on the host; each leaves a file in the returned directory.
func hostileWorkspace(t *testing.T) (src, ws, markers string) {
	t.Helper()
	src = tu.Repo(t, true)
	ws = filepath.Join(t.TempDir(), `work space's "$(touch pwned-by-the-path)"`)
	if _, err := New(execx.OS{}).Clone(context.Background(), CloneOptions{Source: src, Dest: ws, Branch: "feat"}); err != nil {
		t.Fatal(err)
	}
	// The agent's work, committed before its config turns hostile; a
	// grafts file cuts its last commit from its parent, which a fetch that
	// honoured it would then not send.
	tu.WriteFile(t, filepath.Join(ws, ".gitattributes"), "* filter=evil\n")
	commit(t, ws, "a.txt", "agent work")
	commit(t, ws, "b.txt", "more agent work")
	tu.WriteFile(t, filepath.Join(ws, ".git", "info", "grafts"), tu.Git(t, ws, "rev-parse", "HEAD")+"\n")
	// A commit of the user's the workspace lacks: the fetch offers it as a
	// "have", which a lazy fetch in upload-pack would go looking for.
	commit(t, src, "later.txt", "the user's later work")

	markers = t.TempDir()
	script := func(name string) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\ntouch '"+filepath.Join(markers, name)+"'\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hooks := t.TempDir()
	for _, h := range hookNames {
		os.Rename(script("hooksPath-"+h), filepath.Join(hooks, h))
		os.Rename(script("hooks-"+h), filepath.Join(ws, ".git", "hooks", h))
	}
	for key, val := range map[string]string{
		"core.hooksPath":               hooks,
		"core.fsmonitor":               script("fsmonitor"),
		"core.alternateRefsCommand":    script("alternateRefsCommand"),
		"core.sshCommand":              script("sshCommand"),
		"uploadpack.packObjectsHook":   script("packObjectsHook"),
		"filter.evil.clean":            script("clean"),
		"filter.evil.smudge":           script("smudge"),
		"filter.evil.process":          script("process"),
		"filter.evil.required":         "true",
		"core.repositoryformatversion": "1",
		"extensions.partialClone":      "evil",
		"remote.evil.promisor":         "true",
		"remote.evil.url":              "ext::" + script("ext") + " %S",
		"protocol.ext.allow":           "always",
		"protocol.allow":               "always",
		"gc.auto":                      "1",
	} {
		tu.Git(t, ws, "config", key, val)
	}
	return src, ws, markers
}

// The workspace is the agent's: a sync runs nothing of it on the host.
func TestSyncRunsNothingOfTheWorkspace(t *testing.T) {
	src, ws, markers := hostileWorkspace(t)
	tip := tu.Git(t, ws, "rev-parse", "HEAD")
	res := sync(t, ws, src, "feat")
	if res.New != tip || res.Commits != 2 {
		t.Errorf("got %+v, want the agent's 2 commits up to %s", *res, tip)
	}
	ran, _ := os.ReadDir(markers)
	for _, m := range ran {
		t.Errorf("syncing ran the workspace's %s", m.Name())
	}
	for _, dir := range []string{src, ws, filepath.Dir(ws)} {
		if _, err := os.Stat(filepath.Join(dir, "pwned-by-the-path")); err == nil {
			t.Errorf("the workspace's path was run as a command (found in %s)", dir)
		}
	}
	// The control: git run in the workspace as it is does run them. A
	// file's new mtime makes status hash it again, through the filter;
	// otherwise whether it does depends on the index's timestamps.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(ws, "a.txt"), later, later); err != nil {
		t.Fatal(err)
	}
	naive := exec.Command("git", "-C", ws, "status")
	naive.Env = append(os.Environ(), "HOME="+t.TempDir())
	naive.Run()
	for _, m := range []string{"fsmonitor", "process"} {
		if _, err := os.Stat(filepath.Join(markers, m)); err != nil {
			t.Errorf("the hostile workspace is not: git status there did not run its %s", m)
		}
	}
}

// A workspace of another user (the guest's uid, when agent-vm runs as
// root), which upload-pack refuses unless told it is safe.
func TestSyncFromAWorkspaceOfAnotherUser(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "needs root to give the workspace to another user")
	src, ws := freshWorkspace(t)
	commit(t, ws, "a.txt", "agent work")
	err := filepath.WalkDir(ws, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 65534, 65534)
	})
	if err != nil {
		t.Fatal(err)
	}
	if res := sync(t, ws, src, "feature/x"); res.Commits != 1 {
		t.Errorf("got %+v, want the agent's commit", *res)
	}
}

func TestSyncRefusals(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, ws string) (dir, branch string)
		want  []string
	}{
		{"not a git repository", func(t *testing.T, ws string) (string, string) {
			dir := t.TempDir()
			tu.WriteFile(t, filepath.Join(dir, "a.txt"), "a\n")
			return dir, "feature/x"
		}, []string{"has no .git directory"}},
		{"a .git file pointing elsewhere", func(t *testing.T, ws string) (string, string) {
			dir := t.TempDir()
			tu.WriteFile(t, filepath.Join(dir, ".git"), "gitdir: "+filepath.Join(ws, ".git")+"\n")
			return dir, "feature/x"
		}, []string{"has no .git directory"}},
		{"the branch renamed", func(t *testing.T, ws string) (string, string) {
			commit(t, ws, "a.txt", "agent work")
			tu.Git(t, ws, "branch", "-m", "feature/x", "renamed\u202e")
			return ws, "feature/x"
		}, []string{`no branch "feature/x"`, `renamed\u202e`, "main", "git branch -m OTHER feature/x"}},
		{"an invalid branch name", func(t *testing.T, ws string) (string, string) { return ws, "a..b" },
			[]string{`invalid branch name "a..b"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, ws := freshWorkspace(t)
			dir, branch := c.setup(t, ws)
			_, err := New(execx.OS{}).Sync(context.Background(), dir, src, branch)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if got := syncedRefs(t, src); got != "" {
				t.Errorf("a refused sync wrote refs: %s", got)
			}
		})
	}
}
