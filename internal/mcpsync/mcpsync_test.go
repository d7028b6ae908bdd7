package mcpsync

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/driver"
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

// A sync with no server to bring and none an earlier sync brought leaves
// the guest alone (it does not connect); with an earlier sync's server to
// take out, or a server to bring, it connects. Labelled fake: the VMs
// (fakeVMs), whose Connect records that it was asked and fails.
func TestSyncReachesTheGuestOnlyWithSomethingToWrite(t *testing.T) {
	home := t.TempDir()
	withServer := t.TempDir()
	if err := os.WriteFile(filepath.Join(withServer, ".claude.json"), []byte(`{"mcpServers":{"db":{"command":"db-server"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		configDir string
		synced    []string
		connect   bool
	}{
		{"no server, none before", "", nil, false},
		{"no server, one before", "", []string{"old"}, true},
		{"a server", withServer, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			vms := &fakeVMs{rec: &state.Record{Version: state.RecordVersion, Branch: "x", Slug: "x", MCPSynced: c.synced,
				Guest: state.Guest{User: "dev"}, Ports: state.Ports{SSH: 2222, MCP: 1}}}
			getenv := func(k string) string {
				switch k {
				case "HOME":
					return home
				case mcpconfig.ConfigDirEnv:
					return c.configDir
				}
				return ""
			}
			res, err := Sync(context.Background(), vms, "x", Options{Getenv: getenv})
			if vms.connected != c.connect {
				t.Errorf("connected to the guest: %v, want %v", vms.connected, c.connect)
			}
			if c.connect {
				if err == nil || !strings.Contains(err.Error(), "fake: no guest") {
					t.Errorf("Sync: %+v, %v; want it to reach the guest", res, err)
				}
				return
			}
			if err != nil || !res.Unchanged || res.Written {
				t.Errorf("Sync: %+v, %v; want it unchanged, nothing written", res, err)
			}
		})
	}
}

// fakeVMs is a FAKE VMs of one running VM: Connect records that it was
// asked and fails.
type fakeVMs struct {
	VMs
	rec       *state.Record
	connected bool
}

func (f *fakeVMs) Find(ctx context.Context, name string) (state.Entry, error) {
	return state.Entry{Slug: f.rec.Slug, Record: f.rec}, nil
}

func (f *fakeVMs) State(ctx context.Context, e state.Entry) string { return driver.StateRunning }

func (f *fakeVMs) Connect(ctx context.Context, name string) (*ssh.Client, string, error) {
	f.connected = true
	return nil, "", errors.New("fake: no guest")
}

func (f *fakeVMs) GuestPrograms(string) []string { return nil }
