package vm

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/state"
)

// TestPortsOfACreateThatCommitsMidAllocationAreTaken forces the interleaving
// that once gave two VMs the same ports: another create moves its staging
// directory into place between the reads of allocatePorts (which does not
// hold that create's lock). The ports it holds must still count as taken.
func TestPortsOfACreateThatCommitsMidAllocationAreTaken(t *testing.T) {
	root, err := state.Open(StateDir(t.TempDir()))
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

// Ports are one namespace for the host, records one per state directory:
// a VM created in one state directory must not get the ports a (stopped,
// so not listening) VM of another holds, when both are registered.
func TestPortsOfAnotherStateDirectoryAreTaken(t *testing.T) {
	reg := &state.Registry{Dir: hostdir.Top(filepath.Join(t.TempDir(), "registry"), 0o700, hostdir.InXDG)}
	open := func() *Manager {
		root, err := state.Open(StateDir(t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Add(root.Dir); err != nil {
			t.Fatal(err)
		}
		// Nothing listens: only the records can tell a port is taken.
		return &Manager{Root: root, Registry: reg, PortFree: func(int) bool { return true }}
	}
	ctx := context.Background()
	create := func(m *Manager, slug string, ssh int) (*state.Record, error) {
		c, err := m.Root.BeginCreate(slug)
		if err != nil {
			t.Fatal(err)
		}
		rec := &state.Record{Version: state.RecordVersion, Branch: slug, Slug: slug}
		if err := m.allocatePorts(ctx, 0, ssh, rec, c.Layout); err != nil {
			c.Abort()
			return nil, err
		}
		if _, err := c.Commit(); err != nil {
			t.Fatal(err)
		}
		return rec, nil
	}
	a, b := open(), open()
	first, err := create(a, "first", 0)
	if err != nil {
		t.Fatal(err)
	}
	second, err := create(b, "second", 0)
	if err != nil {
		t.Fatal(err)
	}
	if second.Ports.SSH == first.Ports.SSH || second.Ports.MCP == first.Ports.MCP {
		t.Errorf("VMs of two state directories got the same ports: %+v and %+v", first.Ports, second.Ports)
	}
	_, err = create(b, "pinned", first.Ports.SSH)
	if err == nil || !strings.Contains(err.Error(), a.Root.Dir) || !strings.Contains(err.Error(), `"first"`) {
		t.Errorf("--ssh-port of another state directory's VM: %v; want a refusal naming that VM and its state directory", err)
	}
}
