package cli

import (
	"encoding/json"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// sync brings the agent's commits into the user's repository, says what
// it did in one line or as JSON, and destroy then lets the VM go.
func TestSyncBringsTheAgentsCommitsHome(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	ws := agentCommitted(t, repo, st)
	tip := tu.Git(t, ws, "rev-parse", "HEAD")

	r := agentVM(t, repo, st, "destroy", "w")
	if r.code != 1 || !strings.Contains(r.stderr, "agent-vm sync w") {
		t.Fatalf("destroy before sync: exit %d, want 1 with `agent-vm sync w` offered:\n%s", r.code, r.stderr)
	}
	r = mustRun(t, repo, st, "sync", "w")
	if want := "refs/remotes/agent-vm/w: new at " + tip[:12] + " (1 new commit)\n"; r.stdout != want {
		t.Errorf("sync: got %q, want %q", r.stdout, want)
	}
	if got := tu.Git(t, repo, "rev-parse", "refs/remotes/agent-vm/w"); got != tip {
		t.Errorf("the repository's ref is at %s, want %s", got, tip)
	}

	// On the VM's branch, no BRANCH needed; --json has every field.
	tu.Git(t, repo, "checkout", "--quiet", "-b", "w")
	r = mustRun(t, repo, st, "sync", "--json")
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("sync --json is not JSON: %v\n%s", err, r.stdout)
	}
	want := map[string]any{"branch": "w", "ref": "refs/remotes/agent-vm/w", "old": tip, "new": tip, "commits": 0.0, "forced": false}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("sync --json: %s is %v, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("sync --json: got %v, want the fields of %v", got, want)
	}

	tu.Git(t, ws, "commit", "--quiet", "--amend", "-m", "agent's work, amended")
	amended := tu.Git(t, ws, "rev-parse", "HEAD")
	r = mustRun(t, repo, st, "sync")
	if want := "refs/remotes/agent-vm/w: " + tip[:12] + "..." + amended[:12] + " (forced: the branch was rewritten; 1 new commit)\n"; r.stdout != want {
		t.Errorf("sync after an amend: got %q, want %q", r.stdout, want)
	}
	if r := mustRun(t, repo, st, "sync"); !strings.HasSuffix(r.stdout, "up to date at "+amended[:12]+"\n") {
		t.Errorf("sync again: got %q", r.stdout)
	}
	mustRun(t, repo, st, "destroy", "w")
}
