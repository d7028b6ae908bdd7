package cli

import (
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// suspend and resume refuse what they cannot do, naming the VM and the
// command that does it. (Suspending and resuming a running VM is
// internal/vm's TestSuspendResume, a real boot.)
func TestSuspendResumeRefusals(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "sus", "--backend", "qemu", "--memory", "1G", "--cpus", "1")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"suspend", "sus"}, []string{`VM "sus" is stopped`, "nothing to suspend", "agent-vm start sus"}},
		{[]string{"resume", "sus"}, []string{`VM "sus" is stopped, not suspended`, "agent-vm start sus"}},
		{[]string{"suspend", "no-such-branch"}, []string{"no-such-branch"}},
		{[]string{"resume", "no-such-branch"}, []string{"no-such-branch"}},
		{[]string{"suspend", "a", "b"}, []string{"at most one BRANCH"}},
		{[]string{"suspend", "--save", "sus"}, []string{`VM "sus" is stopped`, "nothing to suspend"}},
		{[]string{"suspend", "--save", "--pause", "sus"}, []string{"--save, --pause and --hibernate are ways of suspending", "give one"}},
		{[]string{"suspend", "--pause", "--hibernate", "sus"}, []string{"ways of suspending", "give one"}},
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

// What suspend says it did: saved to disk, or paused in place and why,
// with the host RAM its QEMU holds; what stop says of a suspended VM.
func TestSuspendMessages(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  vm.SuspendResult
		want []string
	}{
		{"saved", vm.SuspendResult{Branch: "feat", Took: 12300 * time.Millisecond, Detail: "saved to disk 2025-01-02 03:04:05, 700 MiB"},
			[]string{"suspended the VM of branch feat in 12.3s: saved to disk 2025-01-02 03:04:05, 700 MiB (agent-vm resume feat brings it back)\n"}},
		{"busy", vm.SuspendResult{Branch: "feat", Took: 200 * time.Millisecond, Paused: true, HostRAM: 812 << 20, Busy: "42 claude (working directory)"},
			[]string{"paused the VM of branch feat in place in 200ms: the workspace is in use by\n  42 claude (working directory)\n",
				"the VM's memory stays in its QEMU (812 MiB of host RAM), and the workspace stays mounted. `agent-vm resume feat` continues it"}},
		{"cannot save", vm.SuspendResult{Branch: "nix", Paused: true, CannotSave: "no hot-pluggable slot"},
			[]string{"paused the VM of branch nix in place in 0s, as it cannot be saved to disk: no hot-pluggable slot\n", "stays in its QEMU, and"}},
		{"hibernated", vm.SuspendResult{Branch: "feat", Took: time.Second, Paused: true, Suspend: vminfo.SuspendHibernated, Detail: "hibernated (...; a connection to the VM wakes it) since ...; `agent-vm resume feat` continues it"},
			[]string{"suspended the VM of branch feat in 1s: hibernated (...; a connection to the VM wakes it) since ...; `agent-vm resume feat` continues it\n"}},
		{"saved, no detail", vm.SuspendResult{Branch: "feat"}, []string{"suspended the VM of branch feat in 0s (agent-vm resume feat brings it back)\n"}},
		{"asked, RAM unknown (vagrant)", vm.SuspendResult{Branch: "vg", Paused: true},
			[]string{"paused the VM of branch vg in place in 0s\nNo guest code runs; the VM's memory stays in its QEMU, and"}},
	} {
		got := suspendMessage(&tc.res)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
		if n := strings.Count(got, "agent-vm resume"); n > 1 {
			t.Errorf("%s: %q names resume %d times", tc.name, got, n)
		}
	}
	if got := stoppedSuspended(&vm.StopResult{Branch: "feat", Was: vminfo.StateSuspended, Suspend: vminfo.SuspendPaused}); !strings.Contains(got, "was paused in place: shut it down") {
		t.Errorf("stop of a paused VM says %q", got)
	}
	if got := stoppedSuspended(&vm.StopResult{Branch: "feat", Was: vminfo.StateSuspended, Suspend: vminfo.SuspendSaved}); !strings.Contains(got, "discarded its saved state") {
		t.Errorf("stop of a saved VM says %q", got)
	}
}
