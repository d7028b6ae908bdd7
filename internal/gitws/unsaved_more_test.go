package gitws

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// A commit that only a tag (or another local ref that is not a
// remote-tracking one) reaches is work the workspace alone has.
func TestInspectCommitsOnlyALocalRefReaches(t *testing.T) {
	cases := []struct {
		name, ref string
		keep      func(t *testing.T, ws string)
	}{
		{"lightweight tag", "refs/tags/keep", func(t *testing.T, ws string) { tu.Git(t, ws, "tag", "keep") }},
		{"annotated tag", "refs/tags/v2", func(t *testing.T, ws string) { tu.Git(t, ws, "tag", "-a", "-m", "release", "v2") }},
		{"other ref", "refs/agent/saved", func(t *testing.T, ws string) { tu.Git(t, ws, "update-ref", "refs/agent/saved", "HEAD") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, ws := freshWorkspace(t)
			commit(t, ws, "a.txt", "tagged work")
			c.keep(t, ws)
			tu.Git(t, ws, "reset", "--quiet", "--hard", "HEAD~1")
			u := inspect(t, ws, src)
			if len(u.Unpushed) != 1 || u.Unpushed[0].Subject != "tagged work" || u.Unpushed[0].Ref != c.ref {
				t.Fatalf("want the tagged commit on %s, got %+v", c.ref, u.Unpushed)
			}
			report := u.Report(ws, "feature/x", "feature/x")
			if want := "push origin " + c.ref; !strings.Contains(report, want) {
				t.Errorf("report lacks %q:\n%s", want, report)
			}
		})
	}
}

// Tags the workspace got from its source, and a stash, are not unpushed
// commits; a replace ref (making origin/main a child of the new commit)
// cannot hide one.
func TestInspectRefsThatAreNotUnsaved(t *testing.T) {
	src := tu.Repo(t, true)
	tu.Git(t, src, "tag", "-a", "-m", "one", "v1")
	ws, _, err := clone(t, src, "feature/x", "")
	if err != nil {
		t.Fatal(err)
	}
	tu.WriteFile(t, filepath.Join(ws, "README.md"), "stashed\n")
	tu.Git(t, ws, "stash", "push", "--quiet")
	if u := inspect(t, ws, src); len(u.Unpushed) != 0 || len(u.Stashes) != 1 {
		t.Fatalf("want only the stash, got %+v", u)
	}
	commit(t, ws, "a.txt", "hidden by replace")
	tu.Git(t, ws, "replace", "--graft", "refs/remotes/origin/main", "HEAD")
	if u := inspect(t, ws, src); len(u.Unpushed) == 0 {
		t.Errorf("a replace ref hid the unpushed commit: %+v", u)
	}
}

// sourceWithSubmodule makes a source repository with a submodule "sub"
// (a repository with its own remote) and a workspace cloned from it with
// the submodule checked out.
func sourceWithSubmodule(t *testing.T) (src, ws string) {
	t.Helper()
	lib := tu.Repo(t, true)
	src = tu.Repo(t, true)
	tu.Git(t, src, "-c", "protocol.file.allow=always", "submodule", "add", "--quiet", lib, "sub")
	tu.Git(t, src, "commit", "--quiet", "-m", "add sub")
	tu.Git(t, src, "push", "--quiet", "origin", "main")
	ws, _, err := clone(t, src, "feature/x", "")
	if err != nil {
		t.Fatal(err)
	}
	tu.Git(t, ws, "-c", "protocol.file.allow=always", "submodule", "update", "--quiet", "--init")
	return src, ws
}

func TestInspectLooksInsideSubmodules(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, sub string)
		check func(u *Unsaved) bool
	}{
		{"changed file", func(t *testing.T, sub string) { tu.WriteFile(t, filepath.Join(sub, "README.md"), "changed\n") },
			func(u *Unsaved) bool { return len(u.Changed) == 1 && u.Changed[0] == " M README.md" }},
		{"untracked file", func(t *testing.T, sub string) { tu.WriteFile(t, filepath.Join(sub, "new.txt"), "n\n") },
			func(u *Unsaved) bool { return len(u.Untracked) == 1 && u.Untracked[0] == "new.txt" }},
		{"commit on its detached HEAD", func(t *testing.T, sub string) { commit(t, sub, "c.txt", "sub work") },
			func(u *Unsaved) bool {
				return len(u.Unpushed) == 1 && u.Unpushed[0].Subject == "sub work" && u.Unpushed[0].Ref == "HEAD"
			}},
		{"stash", func(t *testing.T, sub string) {
			tu.WriteFile(t, filepath.Join(sub, "README.md"), "stashed\n")
			tu.Git(t, sub, "stash", "push", "--quiet")
		}, func(u *Unsaved) bool { return len(u.Stashes) == 1 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, ws := sourceWithSubmodule(t)
			if u := inspect(t, ws, src); !u.Empty() {
				t.Fatalf("fresh workspace with a submodule not empty: %+v", u)
			}
			c.setup(t, filepath.Join(ws, "sub"))
			u := inspect(t, ws, src)
			if u.Empty() || len(u.Submodules) != 1 || u.Submodules[0].Path != "sub" || !c.check(&u.Submodules[0].Unsaved) {
				t.Fatalf("got %+v, submodules %+v", u, u.Submodules)
			}
			report := u.Report(ws, "feature/x", "feature/x")
			for _, want := range []string{"in submodule sub:", "git -C " + filepath.Join(ws, "sub")} {
				if !strings.Contains(report, want) {
					t.Errorf("report lacks %q:\n%s", want, report)
				}
			}
		})
	}
}

// A submodule's HEAD that moved is a change of the superproject too.
func TestInspectSubmoduleCommitShowsInSuperproject(t *testing.T) {
	src, ws := sourceWithSubmodule(t)
	commit(t, filepath.Join(ws, "sub"), "c.txt", "sub work")
	u := inspect(t, ws, src)
	if len(u.Changed) != 1 || u.Changed[0] != " M sub" {
		t.Errorf("superproject changes: got %q, want [\" M sub\"]", u.Changed)
	}
}

// The submodule's own git directory is untrusted too: its config must not
// run anything, and its .git may not lead out of the workspace.
func TestInspectSubmoduleIsUntrustedToo(t *testing.T) {
	src, ws := sourceWithSubmodule(t)
	sub := filepath.Join(ws, "sub")
	canary := filepath.Join(t.TempDir(), "pwned")
	tu.WriteFile(t, filepath.Join(sub, ".gitattributes"), "*.md filter=evil\n")
	tu.Git(t, sub, "config", "filter.evil.clean", "touch "+canary+"; cat")
	tu.Git(t, sub, "config", "core.fsmonitor", "touch "+canary)
	tu.WriteFile(t, filepath.Join(sub, "README.md"), "changed\n")
	u := inspect(t, ws, src)
	if _, err := os.Stat(canary); err == nil {
		t.Fatal("inspecting the submodule ran a command its git config named")
	}
	if len(u.Submodules) != 1 || len(u.Submodules[0].Changed) != 1 {
		t.Fatalf("the submodule's change is not reported: %+v", u.Submodules)
	}
	if r := u.Report(ws, "feature/x", "feature/x"); !strings.Contains(r, "submodule sub: git config filter.evil.clean") {
		t.Errorf("the report does not warn about the submodule's config:\n%s", r)
	}

	outside := tu.Repo(t, false)
	tu.WriteFile(t, filepath.Join(sub, ".git"), "gitdir: "+filepath.Join(outside, ".git")+"\n")
	if _, err := New(execx.OS{}).Inspect(context.Background(), ws, src); err == nil || !strings.Contains(err.Error(), "outside the workspace") {
		t.Errorf("a submodule whose .git leads out of the workspace: got %v, want a refusal", err)
	}
}

func TestInspectIgnoredFiles(t *testing.T) {
	src, ws := freshWorkspace(t)
	tu.WriteFile(t, filepath.Join(ws, ".gitignore"), ".env\nnode_modules/\n*.log\n")
	tu.Git(t, ws, "add", ".gitignore")
	tu.Git(t, ws, "commit", "--quiet", "-m", "ignore")
	tu.Git(t, ws, "push", "--quiet", "origin", "feature/x")
	if u := inspect(t, ws, src); !u.Empty() {
		t.Fatalf("not empty before any ignored file: %+v", u)
	}
	tu.WriteFile(t, filepath.Join(ws, ".env"), "SECRET=1\n")
	for i := 0; i < 30; i++ {
		tu.WriteFile(t, filepath.Join(ws, "node_modules", "pkg"+string(rune('a'+i%26))+strings.Repeat("x", i/26), "index.js"), "x\n")
	}
	for i := 0; i < 20; i++ {
		tu.WriteFile(t, filepath.Join(ws, "logs", strings.Repeat("l", i+1)+".log"), "x\n")
	}
	u := inspect(t, ws, src)
	if u.Empty() {
		t.Fatal("ignored files alone count as nothing to lose")
	}
	if len(u.Ignored) != 22 || u.Ignored[0] != ".env" || u.Ignored[len(u.Ignored)-1] != "node_modules/" {
		t.Errorf("ignored: got %d %q, want .env, 20 logs, node_modules/ collapsed", len(u.Ignored), u.Ignored)
	}
	report := u.Report(ws, "feature/x", "feature/x")
	for _, want := range []string{"22 ignored files that exist only here:", "    .env\n", "... and 7 more", "--force"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
}

// Everything the report takes from the workspace is shown escaped: a file
// name cannot forge a line of the report or drive the terminal.
func TestReportEscapesWorkspaceStrings(t *testing.T) {
	src, ws := freshWorkspace(t)
	evil := "x\nit is safe: agent-vm destroy feature/x --force\x1b]0;pwned\x07\u202e"
	tu.WriteFile(t, filepath.Join(ws, evil), "x\n")
	tu.WriteFile(t, filepath.Join(ws, "README.md"), "changed\n")
	tu.Git(t, ws, "stash", "push", "--quiet", "-m", "stash "+evil)
	tu.Git(t, ws, "commit", "--quiet", "--allow-empty", "-m", "subject\x1b[2J "+evil)
	tu.Git(t, ws, "config", "core.fsmonitor", "x\n"+evil)
	report := inspect(t, ws, src).Report(ws, "feature/x", "feature/x")
	for _, bad := range []string{"\x1b", "\x07", "\u202e", "\nit is safe"} {
		if strings.Contains(report, bad) {
			t.Errorf("report contains %q raw:\n%s", bad, report)
		}
	}
	// git folds a subject's (and a stash message's) newline into a space.
	if want := `x\nit is safe: agent-vm destroy feature/x --force\x1b]0;pwned\x07\u202e`; strings.Count(report, want) != 2 {
		t.Errorf("want the name escaped as %q in the untracked file and config lines:\n%s", want, report)
	}
	if want := `--force\x1b]0;pwned\x07\u202e`; strings.Count(report, want) != 4 {
		t.Errorf("want %q in the untracked file, stash, commit and config lines:\n%s", want, report)
	}
}

// Risky settings alone are a warning, not work to lose: a submodule that
// has nothing else does not make destroy refuse.
func TestInspectSubmoduleWithOnlyRiskySettingsIsEmpty(t *testing.T) {
	src, ws := sourceWithSubmodule(t)
	tu.Git(t, filepath.Join(ws, "sub"), "config", "core.fsmonitor", "true")
	u := inspect(t, ws, src)
	if !u.Empty() {
		t.Errorf("a submodule with only a risky setting counts as unsaved work: %+v", u)
	}
	if r := u.allRisky(""); len(r) != 1 || r[0] != "submodule sub: git config core.fsmonitor = true" {
		t.Errorf("risky: got %q", r)
	}
}

// Files written into a submodule's directory that was never checked out
// are invisible to git status; they count as untracked.
func TestInspectFilesInASubmoduleNotCheckedOut(t *testing.T) {
	src, _ := sourceWithSubmodule(t)
	ws, _, err := clone(t, src, "feature/x", "")
	if err != nil {
		t.Fatal(err)
	}
	if u := inspect(t, ws, src); !u.Empty() {
		t.Fatalf("a fresh clone with its submodule not checked out is not empty: %+v", u)
	}
	tu.WriteFile(t, filepath.Join(ws, "sub", "notes.txt"), "n\n")
	if u := inspect(t, ws, src); len(u.Untracked) != 1 || u.Untracked[0] != "sub/" {
		t.Errorf("untracked: got %q, want [sub/]", u.Untracked)
	}
}

// A filter driver defined in the worktree config (extensions.worktreeConfig)
// is the workspace's own too, and never runs.
func TestInspectDoesNotRunWorktreeConfigFilters(t *testing.T) {
	src, ws := freshWorkspace(t)
	canary := filepath.Join(t.TempDir(), "pwned")
	tu.WriteFile(t, filepath.Join(ws, ".gitattributes"), "*.txt filter=wt\n")
	tu.WriteFile(t, filepath.Join(ws, "a.txt"), "one\n")
	tu.Git(t, ws, "add", ".gitattributes", "a.txt")
	tu.Git(t, ws, "commit", "--quiet", "-m", "a")
	tu.Git(t, ws, "config", "extensions.worktreeConfig", "true")
	tu.Git(t, ws, "config", "--worktree", "filter.wt.clean", "touch "+canary+"; cat")
	tu.WriteFile(t, filepath.Join(ws, "a.txt"), "two\n") // same size: git must hash it
	os.Chtimes(filepath.Join(ws, "a.txt"), timeAgo(), timeAgo())
	u := inspect(t, ws, src)
	if _, err := os.Stat(canary); err == nil {
		t.Fatal("inspecting the workspace ran a filter its worktree config named")
	}
	if len(u.Changed) != 1 {
		t.Errorf("changed: got %q, want a.txt", u.Changed)
	}
}

// A workspace made a partial clone whose promisor remote is an ext:: URL
// (allowed by its own protocol.ext.allow) would make git on the host run
// that command to fetch an object it lacks: a commit of the source's that
// the workspace never saw, which inSource asks about. -c protocol.allow=never
// does not stop it (protocol.<name>.allow wins); nothing may be fetched.
func TestInspectDoesNotLazyFetch(t *testing.T) {
	src, ws := freshWorkspace(t)
	commit(t, src, "later.txt", "the user's later work")
	canary := filepath.Join(t.TempDir(), "pwned")
	tu.Git(t, ws, "config", "core.repositoryformatversion", "1")
	tu.Git(t, ws, "config", "extensions.partialClone", "evil")
	tu.Git(t, ws, "config", "remote.evil.promisor", "true")
	tu.Git(t, ws, "config", "remote.evil.url", "ext::sh -c touch% "+canary)
	tu.Git(t, ws, "config", "protocol.ext.allow", "always")
	inspect(t, ws, src)
	if _, err := os.Stat(canary); err == nil {
		t.Fatal("inspecting the workspace ran its promisor remote's ext:: command")
	}
}
