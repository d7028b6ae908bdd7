package vm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/state"
)

// pickHostPort: a free guest port keeps its number; a privileged one, one
// another VM's record holds, or one busy on the host gets the lowest free
// port of the range; an explicit port is checked, not replaced.
func TestPickHostPort(t *testing.T) {
	root, err := state.Open(StateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	busy := map[int]bool{3001: true, 8000: true}
	m := &Manager{Root: root, PortFree: func(p int) bool { return !busy[p] }}
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
		got, err := m.pickHostPort(tc.guest, tc.host)
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

// A VM's driver machine carries the user's forwards after SSH and MCP, so
// every start applies them.
func TestMachineCarriesTheForwards(t *testing.T) {
	r := &state.Record{VMName: "agent-vm-x", Ports: state.Ports{SSH: 2222, MCP: 8001},
		Forwards: []state.Forward{{Guest: 3000, Host: 3000}, {Guest: 80, Host: 8002}}}
	got := fmt.Sprint((&Manager{}).machine(r, state.Layout{Dir: "/s/x"}).Forwards)
	want := "[{ssh 2222 22} {mcp 8001 8000} {forward of guest port 3000 3000 3000} {forward of guest port 80 8002 80}]"
	if got != want {
		t.Errorf("forwards %s, want %s", got, want)
	}
}
