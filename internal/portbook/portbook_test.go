package portbook

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/testutil"
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

// A start that finds another program listening on a port agent-vm picked
// (another user's VM took it while this one was stopped) moves that port,
// in the record and in the pinned host key; a port the user chose stays,
// for the driver's check at the start to name, as do a foreign guest's.
func TestRebindMovesAPickedPortAnotherProgramHolds(t *testing.T) {
	rebindGrace = 100 * time.Millisecond
	t.Cleanup(func() { rebindGrace = 3 * time.Second })
	root, err := state.Open(&hostdir.Dir{Path: t.TempDir(), Mode: 0o700, Place: hostdir.InXDG})
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	b := &Book{Root: root, Free: ports.Listenable, Log: hclog.New(&hclog.LoggerOptions{Output: &logged})}
	ctx := context.Background()
	st, err := root.BeginCreate("v")
	if err != nil {
		t.Fatal(err)
	}
	rec := &state.Record{Version: state.RecordVersion, Branch: "v", Slug: "v"}
	if err := b.Assign(ctx, 0, 0, rec, st.Layout); err != nil {
		t.Fatal(err)
	}
	picked, err := b.ForForward(18000, 0)
	if err != nil {
		t.Fatal(err)
	}
	chosenPort := testutil.FreePort(t)
	rec.Forwards = []state.Forward{{Guest: 18000, Host: picked}, {Guest: 18001, Host: chosenPort, Chosen: true}}
	if err := st.Layout.MakeDirs(); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteSecrets(st.Layout, rec); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteRecord(st.Layout.Record(), rec); err != nil {
		t.Fatal(err)
	}
	l, err := st.Commit()
	if err != nil {
		t.Fatal(err)
	}

	// Nothing else listens: nothing moves.
	before := *rec
	before.Forwards = slices.Clone(rec.Forwards)
	if err := b.Rebind(ctx, rec, l); err != nil || rec.Ports != before.Ports || !slices.Equal(rec.Forwards, before.Forwards) {
		t.Fatalf("with its ports free: %v, ports %+v %+v, want %+v %+v", err, rec.Ports, rec.Forwards, before.Ports, before.Forwards)
	}

	// Another program on the SSH port, the picked forward's and the chosen one's.
	for _, p := range []int{rec.Ports.SSH, picked, chosenPort} {
		hold(t, p)
	}
	if err := b.Rebind(ctx, rec, l); err != nil {
		t.Fatal(err)
	}
	if rec.Ports.SSH == before.Ports.SSH || rec.Ports.SSH < ports.SSHRange().Lo || rec.Ports.SSH > ports.SSHRange().Hi || !ports.Listenable(rec.Ports.SSH) {
		t.Errorf("SSH port %d held: it became %d, want a free one of %v", before.Ports.SSH, rec.Ports.SSH, ports.SSHRange())
	}
	if want := fmt.Sprintf("port=ssh was=%d now=%d", before.Ports.SSH, rec.Ports.SSH); !strings.Contains(logged.String(), want) {
		t.Errorf("the warning does not say %q:\n%s", want, logged.String())
	}
	if rec.Ports.MCP != before.Ports.MCP {
		t.Errorf("the free MCP port %d moved to %d", before.Ports.MCP, rec.Ports.MCP)
	}
	if f := rec.Forwards[0]; f.Host == picked || f.Host < ports.ForwardRange().Lo || f.Host > ports.ForwardRange().Hi {
		t.Errorf("picked forward's port %d held: it became %d, want one of %v", picked, f.Host, ports.ForwardRange())
	}
	if f := rec.Forwards[1]; f.Host != chosenPort {
		t.Errorf("the user's port %d moved to %d: the driver's check is to refuse it, naming it", chosenPort, f.Host)
	}
	if got, err := state.ReadRecord(l.Record()); err != nil || got.Ports != rec.Ports || !slices.Equal(got.Forwards, rec.Forwards) {
		t.Errorf("the record on disk: %v, %+v %+v; want %+v %+v", err, got.Ports, got.Forwards, rec.Ports, rec.Forwards)
	}
	hk, err := l.HostPublic()
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := sshkeys.HostKeyCallback(l.KnownHosts())
	if err != nil {
		t.Fatal(err)
	}
	at := func(p int) error {
		return pinned(fmt.Sprintf("127.0.0.1:%d", p), &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p}, hk)
	}
	if err := at(rec.Ports.SSH); err != nil {
		t.Errorf("the host key is not pinned at the new SSH port %d: %v", rec.Ports.SSH, err)
	}
	if err := at(before.Ports.SSH); err == nil {
		t.Errorf("the host key is still pinned at the old SSH port %d, which another program holds", before.Ports.SSH)
	}

	// The user chose the SSH port: it stays; so do a foreign guest's ports.
	hold(t, rec.Ports.SSH)
	for _, tc := range []struct {
		what string
		set  func(*state.Record)
	}{
		{"--ssh-port", func(r *state.Record) { r.Ports.SSHChosen = true }},
		{"a foreign guest", func(r *state.Record) { r.Guest.Foreign = "/repo/Vagrantfile" }},
	} {
		r := *rec
		r.Forwards = slices.Clone(rec.Forwards)
		tc.set(&r)
		if err := b.Rebind(ctx, &r, l); err != nil || r.Ports.SSH != rec.Ports.SSH {
			t.Errorf("%s: %v, SSH port %d -> %d, want it kept", tc.what, err, rec.Ports.SSH, r.Ports.SSH)
		}
	}
}

// hold listens on 127.0.0.1:port until the test ends: another program.
func hold(t *testing.T, port int) {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("holding port %d: %v", port, err)
	}
	t.Cleanup(func() { ln.Close() })
}
