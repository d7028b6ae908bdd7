package vm

import (
	"context"
	"testing"

	"github.com/agent-vm/agent-vm/internal/state"
)

// TestPortsOfACreateThatCommitsMidAllocationAreTaken forces the interleaving
// that once gave two VMs the same ports: another create moves its staging
// directory into place between the reads of allocatePorts (which does not
// hold that create's lock). The ports it holds must still count as taken.
func TestPortsOfACreateThatCommitsMidAllocationAreTaken(t *testing.T) {
	root, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{Root: root, PortFree: func(int) bool { return true }}
	ctx := context.Background()

	// The other create: staged, its record holding the first ports of each range.
	other, err := root.BeginCreate("other")
	if err != nil {
		t.Fatal(err)
	}
	rec := &state.Record{Version: state.RecordVersion, Branch: "other", Slug: "other"}
	if err := m.allocatePorts(ctx, 0, 0, rec, other.Layout); err != nil {
		t.Fatal(err)
	}

	commitOnce := func() {
		if other != nil {
			if _, err := other.Commit(); err != nil {
				t.Error(err)
			}
			other = nil
		}
	}
	betweenPortReads = commitOnce
	t.Cleanup(func() { betweenPortReads = func() {} })

	mine, err := root.BeginCreate("mine")
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Abort()
	got := &state.Record{Version: state.RecordVersion, Branch: "mine", Slug: "mine"}
	if err := m.allocatePorts(ctx, 0, 0, got, mine.Layout); err != nil {
		t.Fatal(err)
	}
	if other != nil {
		t.Fatal("the hook did not run: the test no longer forces the interleaving")
	}
	if got.Ports.SSH == rec.Ports.SSH || got.Ports.MCP == rec.Ports.MCP {
		t.Errorf("two VMs got the same ports: other %+v, mine %+v", rec.Ports, got.Ports)
	}
}
