package vm_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/fork"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// checkpointsAsTheAgentWorks: with a schedule of 10 s, keeping 1, the
// running VM's holder takes automatic checkpoints while an agent session
// prints (works), and keeps the newest of them beside one the user named.
// (That none come with the schedule off, or while the agent waits, is
// internal/autocheckpoint's test.) It runs on a running VM of
// TestTemplate's.
func checkpointsAsTheAgentWorks(t *testing.T, m *vm.Manager, e state.Entry) {
	ctx := context.Background()
	b := e.Record.Branch
	cmd, stdin, err := session.Start(session.Spec{Name: "worker", Argv: []string{"sh", "-c", "while :; do date; sleep 1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if code, err := m.Exec(ctx, b, []string{"sh", "-c", cmd}, bytes.NewReader(stdin), &out, &errs); err != nil || code != 0 {
		t.Fatalf("starting the session: exit %d, %v: %s", code, err, errs.String())
	}
	defer guestSh(t, m, b)(session.Remove("worker"))
	sh := guestSh(t, m, b)
	tu.WaitFor(t, "the worker session to work", func() bool {
		infos, err := session.Parse(sh(session.List()), time.Now())
		w, ok := session.Find(infos, "worker")
		return err == nil && ok && w.State == agentstate.Working
	})
	if _, err := forks(m).Checkpoint(ctx, b, "mine", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := forks(m).Schedule(ctx, b, &state.AutoCheckpoint{Every: "10s", Keep: 1}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	seen := map[string]bool{}
	var autos []string
	tu.WaitFor(t, "two automatic checkpoints", func() bool {
		cs, err := forks(m).Checkpoints(ctx, b)
		if err != nil {
			return false
		}
		autos = autos[:0]
		for _, c := range cs {
			if strings.HasPrefix(c.Name, fork.AutoPrefix) {
				seen[c.Name] = true
				autos = append(autos, c.Name)
			}
		}
		if len(autos) > 1 {
			t.Errorf("%d automatic checkpoints kept, want at most 1: %v", len(autos), autos)
		}
		return len(seen) >= 2
	})
	t.Logf("two automatic checkpoints in %s: the newest kept %v", time.Since(began).Round(time.Second), autos)
	cs, _ := forks(m).Checkpoints(ctx, b)
	if len(cs) == 0 || cs[0].Name != "mine" {
		t.Errorf("checkpoints %+v: want the named one kept", cs)
	}
	if _, err := forks(m).Schedule(ctx, b, nil); err != nil {
		t.Fatal(err)
	}
}
