package cli

import (
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// suspend and resume refuse what they cannot do, naming the VM and the
// command that does it. (Suspending and resuming a running VM is
// internal/vm's TestSuspendResume, a real boot.)
func TestSuspendResumeRefusals(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--branch", "sus", "--backend", "qemu", "--memory", "1G", "--cpus", "1")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"suspend", "sus"}, []string{`VM "sus" is stopped`, "nothing to suspend", "agent-vm start sus"}},
		{[]string{"resume", "sus"}, []string{`VM "sus" is stopped, not suspended`, "agent-vm start sus"}},
		{[]string{"suspend", "no-such-branch"}, []string{"no-such-branch"}},
		{[]string{"resume", "no-such-branch"}, []string{"no-such-branch"}},
		{[]string{"suspend", "a", "b"}, []string{"at most one BRANCH"}},
	} {
		r := agentVM(t, repo, st, tc.args...)
		if r.code == 0 {
			t.Errorf("agent-vm %s: exit 0, want a refusal", strings.Join(tc.args, " "))
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("agent-vm %s: stderr %q lacks %q", strings.Join(tc.args, " "), r.stderr, w)
			}
		}
	}
	// Nothing changed: the VM is stopped, not suspended.
	if s := statusJSON(t, st, "sus"); s["state"] != "stopped" {
		t.Errorf("after the refusals: state %v", s["state"])
	}
}
