package mcpsync

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/mcpconfig"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
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
	if pol, err := egress.ReadPolicy(netpolicy.DirOf(l)); err != nil || !slices.Equal(pol.Exposed, []int{6000, 7000}) || !slices.Equal(pol.Pins, []egress.Pin{hostPin}) {
		t.Errorf("the policy file: %+v, %v; want the ports and the host's pins", pol, err)
	}
}

// lockOnly is VMs with LockVM and Pins alone: record needs no more. The
// host has pins, which the policy it writes carries.
type lockOnly struct {
	VMs
	root *state.Root
}

func (l lockOnly) LockVM(ctx context.Context, slug string) (*state.Lock, error) {
	return l.root.LockVM(ctx, slug)
}

func (l lockOnly) Pins() ([]egress.Pin, error) { return []egress.Pin{hostPin}, nil }

var hostPin = egress.Pin{Name: "registry.npmjs.org", Addr: netip.MustParseAddr("203.0.113.80")}
