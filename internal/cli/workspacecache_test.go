package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// --workspace-cache: create records it, a bad mode is refused by create
// and by start (which leaves the record as it was).
func TestWorkspaceCacheFlag(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	r := agentVM(t, repo, st, "create", "x", "--backend", "qemu", "--workspace-cache", "loose")
	if r.code != 1 || !strings.Contains(r.stderr, `workspace cache mode "loose" is not one of none, auto, always (hint:`) {
		t.Errorf("create --workspace-cache loose: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	mustRun(t, repo, st, "create", "x", "--backend", "qemu", "--workspace-cache", "always")
	mustRun(t, repo, st, "create", "y", "--backend", "qemu")
	for branch, want := range map[string]string{"x": "always", "y": ""} {
		rec, err := state.ReadRecord(filepath.Join(st, branch, "config.json"))
		if err != nil || rec.WorkspaceCache != want {
			t.Errorf("record of %s: workspace_cache %q (%v), want %q", branch, rec.WorkspaceCache, err, want)
		}
	}
	if s := statusJSON(t, st, "x"); s["share_cache"] != "always" {
		t.Errorf("status --json share_cache of x: %v, want always", s["share_cache"])
	}
	if s := statusJSON(t, st, "y"); s["share_cache"] != "auto" {
		t.Errorf("status --json share_cache of y: %v, want the default, auto", s["share_cache"])
	}
	r = agentVM(t, repo, st, "start", "--workspace-cache", "fast", "x")
	if r.code != 1 || !strings.Contains(r.stderr, `workspace cache mode "fast"`) {
		t.Errorf("start --workspace-cache fast: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if rec, err := state.ReadRecord(filepath.Join(st, "x", "config.json")); err != nil || rec.WorkspaceCache != "always" {
		t.Errorf("after a refused start, workspace_cache %q (%v), want always", rec.WorkspaceCache, err)
	}
}
