package gitws

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

func inspect(t *testing.T, ws, src string) *Unsaved {
	t.Helper()
	u, err := New(execx.OS{}).Inspect(context.Background(), ws, src)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func freshWorkspace(t *testing.T) (src, ws string) {
	t.Helper()
	src = tu.Repo(t, true)
	ws, _, err := clone(t, src, "feature/x", "")
	if err != nil {
		t.Fatal(err)
	}
	return src, ws
}

func commit(t *testing.T, dir, file, msg string) {
	t.Helper()
	tu.WriteFile(t, filepath.Join(dir, file), msg+"\n")
	tu.Git(t, dir, "add", file)
	tu.Git(t, dir, "commit", "--quiet", "-m", msg)
}

func TestInspectEachKindOfUnsavedWork(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, ws string)
		check func(u *Unsaved) bool
	}{
		{"modified", func(t *testing.T, ws string) { tu.WriteFile(t, filepath.Join(ws, "README.md"), "changed\n") },
			func(u *Unsaved) bool { return len(u.Changed) == 1 && u.Changed[0] == " M README.md" }},
		{"staged", func(t *testing.T, ws string) {
			tu.WriteFile(t, filepath.Join(ws, "new.txt"), "n\n")
			tu.Git(t, ws, "add", "new.txt")
		}, func(u *Unsaved) bool { return len(u.Changed) == 1 && u.Changed[0] == "A  new.txt" }},
		{"deleted", func(t *testing.T, ws string) { os.Remove(filepath.Join(ws, "README.md")) },
			func(u *Unsaved) bool { return len(u.Changed) == 1 && u.Changed[0] == " D README.md" }},
		{"untracked", func(t *testing.T, ws string) { tu.WriteFile(t, filepath.Join(ws, "dir", "notes.txt"), "n\n") },
			func(u *Unsaved) bool { return len(u.Untracked) == 1 && u.Untracked[0] == "dir/notes.txt" }},
		{"stash", func(t *testing.T, ws string) {
			tu.WriteFile(t, filepath.Join(ws, "README.md"), "stashed\n")
			tu.Git(t, ws, "stash", "push", "--quiet", "-m", "keep me")
		}, func(u *Unsaved) bool {
			return len(u.Stashes) == 1 && strings.Contains(u.Stashes[0], "keep me") && len(u.Changed) == 0
		}},
		{"unpushed commit", func(t *testing.T, ws string) { commit(t, ws, "a.txt", "agent work") },
			func(u *Unsaved) bool {
				return len(u.Unpushed) == 1 && u.Unpushed[0].Subject == "agent work" && u.Unpushed[0].Ref == "refs/heads/feature/x"
			}},
		{"unpushed on another branch", func(t *testing.T, ws string) {
			tu.Git(t, ws, "checkout", "--quiet", "-b", "side")
			commit(t, ws, "b.txt", "side work")
			tu.Git(t, ws, "checkout", "--quiet", "feature/x")
		}, func(u *Unsaved) bool { return len(u.Unpushed) == 1 && u.Unpushed[0].Ref == "refs/heads/side" }},
		{"detached HEAD commit", func(t *testing.T, ws string) {
			tu.Git(t, ws, "checkout", "--quiet", "--detach")
			commit(t, ws, "c.txt", "detached work")
		}, func(u *Unsaved) bool { return len(u.Unpushed) == 1 && u.Unpushed[0].Ref == "HEAD" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, ws := freshWorkspace(t)
			if u := inspect(t, ws, src); !u.Empty() {
				t.Fatalf("fresh workspace not empty: %+v", u)
			}
			c.setup(t, ws)
			u := inspect(t, ws, src)
			if u.Empty() || !c.check(u) {
				t.Errorf("got %+v", u)
			}
			report := u.Report(ws, "feature/x", "feature/x")
			if !strings.Contains(report, "--force") || !strings.Contains(report, ws) {
				t.Errorf("report lacks the way out:\n%s", report)
			}
		})
	}
}

func TestInspectPushedOrFetchedWorkIsSaved(t *testing.T) {
	src, ws := freshWorkspace(t)
	commit(t, ws, "a.txt", "agent work")
	u := inspect(t, ws, src)
	if len(u.Unpushed) != 1 {
		t.Fatalf("want 1 unpushed commit, got %+v", u.Unpushed)
	}
	report := u.Report(ws, "feature/x", "feature-x")
	for _, want := range []string{"git -C " + ws + " push origin feature/x", "agent-vm sync feature-x"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	tu.Git(t, ws, "push", "--quiet", "origin", "feature/x")
	if u := inspect(t, ws, src); !u.Empty() {
		t.Errorf("after push: %+v", u)
	}

	// Work the user pulled into their repository by fetching from the
	// workspace counts as saved too, though the workspace's origin/* refs
	// never saw it.
	commit(t, ws, "b.txt", "more work")
	tu.Git(t, src, "fetch", "--quiet", ws, "feature/x:from-agent")
	if u := inspect(t, ws, src); !u.Empty() {
		t.Errorf("after fetching into the source: %+v", u)
	}

	// And so does work agent-vm sync brought under SyncRefs.
	commit(t, ws, "c.txt", "still more work")
	sync(t, ws, src, "feature/x")
	if u := inspect(t, ws, src); !u.Empty() {
		t.Errorf("after sync: %+v", u)
	}
}

// The workspace is writable by the agent: its git config must not make
// agent-vm run anything on the host while inspecting it.
func TestInspectDoesNotRunWorkspaceConfiguredCommands(t *testing.T) {
	src, ws := freshWorkspace(t)
	canary := filepath.Join(t.TempDir(), "pwned")
	touch := "touch " + canary
	tu.WriteFile(t, filepath.Join(ws, ".gitattributes"), "*.txt filter=evil\n")
	tu.Git(t, ws, "config", "filter.evil.clean", touch+"; cat")
	tu.Git(t, ws, "config", "filter.evil.process", touch)
	tu.Git(t, ws, "config", "core.fsmonitor", touch)
	tu.Git(t, ws, "config", "log.showSignature", "true")
	tu.Git(t, ws, "config", "gpg.program", touch)
	hook := filepath.Join(ws, ".git", "hooks", "post-index-change")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n"+touch+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A tracked .txt file changed with its size kept makes git hash it
	// through the clean filter.
	tu.WriteFile(t, filepath.Join(ws, "a.txt"), "one\n")
	tu.Git(t, ws, "-c", "filter.evil.clean=cat", "-c", "filter.evil.process=", "add", "a.txt")
	tu.Git(t, ws, "-c", "filter.evil.clean=cat", "-c", "filter.evil.process=", "-c", "core.fsmonitor=false",
		"-c", "core.hooksPath=/dev/null", "commit", "--quiet", "-m", "signed?")
	tu.WriteFile(t, filepath.Join(ws, "a.txt"), "two\n")
	os.Chtimes(filepath.Join(ws, "a.txt"), timeAgo(), timeAgo())
	tu.Git(t, ws, "-c", "core.hooksPath=/dev/null", "-c", "filter.evil.clean=cat", "-c", "filter.evil.process=",
		"-c", "core.fsmonitor=false", "stash", "push", "--quiet")
	tu.WriteFile(t, filepath.Join(ws, "a.txt"), "thr\n")
	os.Remove(canary) // the setup above may have run the hook; only inspection counts

	u := inspect(t, ws, src)
	if _, err := os.Stat(canary); err == nil {
		t.Fatal("inspecting the workspace ran a command its git config named")
	}
	if len(u.Changed) != 1 || len(u.Stashes) != 1 || len(u.Unpushed) != 1 {
		t.Errorf("work not reported with hostile config: %+v", u)
	}
	report := strings.Join(u.Risky, "\n")
	for _, want := range []string{"filter.evil.clean", "filter.evil.process", "core.fsmonitor", "gpg.program", "hook .git/hooks/post-index-change"} {
		if !strings.Contains(report, want) {
			t.Errorf("risky settings lack %q:\n%s", want, report)
		}
	}
	if !strings.Contains(u.Report(ws, "feature/x", "feature/x"), "careful") {
		t.Error("report does not warn about the risky settings")
	}
}

func TestInspectRefusesWorkspaceWhoseGitIsNotADirectory(t *testing.T) {
	ws := t.TempDir()
	tu.WriteFile(t, filepath.Join(ws, ".git"), "gitdir: /etc\n")
	if _, err := New(execx.OS{}).Inspect(context.Background(), ws, ""); err == nil {
		t.Error("a .git file pointing elsewhere was accepted")
	}
}

func timeAgo() (t time.Time) { return time.Now().Add(-time.Hour) }
