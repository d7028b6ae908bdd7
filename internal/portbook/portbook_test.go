package portbook

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
	root, err := state.Open(&hostdir.Dir{Path: t.TempDir(), Mode: 0o700, Place: hostdir.InXDG})
	if err != nil {
		t.Fatal(err)
	}
	m := &Book{Root: root, Free: func(int) bool { return true }}
	ctx := context.Background()

	// The other create: staged, its record holding the first ports of each range.
	other, err := root.BeginCreate("other")
	if err != nil {
		t.Fatal(err)
	}
	rec := &state.Record{Version: state.RecordVersion, Branch: "other", Slug: "other"}
	if err := m.Assign(ctx, 0, 0, rec, other.Layout); err != nil {
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
	if err := m.Assign(ctx, 0, 0, got, mine.Layout); err != nil {
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
	open := func() *Book {
		root, err := state.Open(&hostdir.Dir{Path: t.TempDir(), Mode: 0o700, Place: hostdir.InXDG})
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Add(root.Dir); err != nil {
			t.Fatal(err)
		}
		// Nothing listens: only the records can tell a port is taken.
		return &Book{Root: root, Registry: reg, Free: func(int) bool { return true }}
	}
	ctx := context.Background()
	create := func(m *Book, slug string, ssh int) (*state.Record, error) {
		c, err := m.Root.BeginCreate(slug)
		if err != nil {
			t.Fatal(err)
		}
		rec := &state.Record{Version: state.RecordVersion, Branch: slug, Slug: slug}
		if err := m.Assign(ctx, 0, ssh, rec, c.Layout); err != nil {
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

// ForForward: a free guest port keeps its number; a privileged one, one
// another VM's record holds, or one busy on the host gets the lowest free
// port of the range; an explicit port is checked, not replaced.
func TestForForward(t *testing.T) {
	root, err := state.Open(&hostdir.Dir{Path: t.TempDir(), Mode: 0o700, Place: hostdir.InXDG})
	if err != nil {
		t.Fatal(err)
	}
	busy := map[int]bool{3001: true, 8000: true}
	m := &Book{Root: root, Free: func(p int) bool { return !busy[p] }}
	other, err := root.BeginCreate("other")
	if err != nil {
		t.Fatal(err)
	}
	rec := &state.Record{Version: state.RecordVersion, Branch: "other", Slug: "other", Ports: state.Ports{SSH: 2222, MCP: 8001},
		Forwards: []state.Forward{{Guest: 3002, Host: 3002}, {Guest: 5000, Host: 8002}}}
	if err := state.WriteRecord(other.Layout.Record(), rec); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		guest, host, want int
		err               string
	}{
		{guest: 3000, want: 3000},
		{guest: 80, want: 8003},   // privileged: 8000 busy, 8001 and 8002 the other VM's
		{guest: 3001, want: 8003}, // busy on the host
		{guest: 3002, want: 8003}, // the other VM's forward
		{guest: 2222, want: 8003}, // the other VM's SSH port
		{guest: 3000, host: 9000, want: 9000},
		{guest: 3000, host: 3001, err: "port 3001 is already in use on 127.0.0.1 by another program (hint: stop it, or choose another HOST_PORT)"},
		{guest: 3000, host: 8002, err: `port 8002 is already used by the VM of branch "other" (its forward of guest port 5000)`},
		{guest: 3000, host: 1023, err: "port 1023 is out of range"},
	} {
		got, err := m.ForForward(tc.guest, tc.host)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("guest %d, host %d: got %d, %v; want an error with %q", tc.guest, tc.host, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("guest %d, host %d: got %d, %v; want %d", tc.guest, tc.host, got, err, tc.want)
		}
	}
}
