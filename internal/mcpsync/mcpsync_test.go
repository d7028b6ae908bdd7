package mcpsync

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/mcpconfig"
	"github.com/agent-vm/agent-vm/internal/state"
)

// TestRecordMCPSyncReplacesOnlyItsOwnPorts: a sync replaces the ports an
// earlier sync exposed, keeps the ones another command exposed, and
// records the servers it wrote.
func TestRecordMCPSyncReplacesOnlyItsOwnPorts(t *testing.T) {
	root, err := state.Open(&hostdir.Dir{Path: t.TempDir(), Mode: 0o700, Place: hostdir.InXDG})
	if err != nil {
		t.Fatal(err)
	}
	l := root.Layout("x")
	rec := &state.Record{Version: state.RecordVersion, Branch: "x", Slug: "x", Ports: state.Ports{SSH: 2222, MCP: 8001},
		Exposed:   []state.Exposed{{Port: 5000, Why: "old server", By: state.ExposedByMCPSync}, {Port: 6000, Why: "the user", By: "expose"}},
		MCPSynced: []string{"old"}}
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteRecord(l.Record(), rec); err != nil {
		t.Fatal(err)
	}
	e := state.Entry{Slug: "x", Layout: l, Record: rec}
	err = record(context.Background(), lockOnly{root: root}, e, []state.Exposed{{Port: 7000, Why: "db", By: state.ExposedByMCPSync}},
		map[string]mcpconfig.Server{"db": {}, "a": {}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := state.ReadRecord(l.Record())
	if err != nil {
		t.Fatal(err)
	}
	var ports []int
	for _, x := range got.Exposed {
		ports = append(ports, x.Port)
	}
	if !slices.Equal(ports, []int{6000, 7000}) {
		t.Errorf("exposed %v, want [6000 7000]", ports)
	}
	if !slices.Equal(got.MCPSynced, []string{"a", "db"}) {
		t.Errorf("synced %v, want [a db]", got.MCPSynced)
	}
}

// lockOnly is VMs with LockVM alone: record needs no more.
type lockOnly struct {
	VMs
	root *state.Root
}

func (l lockOnly) LockVM(ctx context.Context, slug string) (*state.Lock, error) {
	return l.root.LockVM(ctx, slug)
}
