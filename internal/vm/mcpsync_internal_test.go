package vm

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/mcpconfig"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vagrantbackend"
)

// TestRecordMCPSyncReplacesOnlyItsOwnPorts: a sync replaces the ports an
// earlier sync exposed, keeps the ones another command exposed, and
// records the servers it wrote.
func TestRecordMCPSyncReplacesOnlyItsOwnPorts(t *testing.T) {
	root, err := state.Open(StateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{Root: root}
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
	err = m.recordMCPSync(context.Background(), e, []state.Exposed{{Port: 7000, Why: "db", By: state.ExposedByMCPSync}},
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

// mcp sync keeps a server whose command the guest has: every guest has
// sh, bash and git; the qemu backend's image has node and python3 too, the
// NixOS and vagrant guests (and a backend this build lacks) are not known
// to.
func TestGuestProgramsPerBackend(t *testing.T) {
	m := New(nil, nil, nil, nil, &debian.Backend{}, &nixos.Backend{}, &vagrantbackend.Backend{})
	for name, want := range map[string]string{
		"qemu":    "sh bash git node npm npx python3 curl",
		"nixos":   "sh bash git",
		"vagrant": "sh bash git",
		"docker":  "sh bash git",
	} {
		if got := strings.Join(m.guestPrograms(name), " "); got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
}
