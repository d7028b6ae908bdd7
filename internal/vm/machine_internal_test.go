package vm

import (
	"fmt"
	"testing"

	"github.com/agent-vm/agent-vm/internal/state"
)

// A VM's driver machine carries the user's forwards after SSH and MCP, so
// every start applies them.
func TestMachineCarriesTheForwards(t *testing.T) {
	r := &state.Record{MachineName: "agent-vm-x", Ports: state.Ports{SSH: 2222, MCP: 8001},
		Forwards: []state.Forward{{Guest: 3000, Host: 3000}, {Guest: 80, Host: 8002}}}
	got := fmt.Sprint((&Manager{}).machine(r, state.Layout{Dir: "/s/x"}).Forwards)
	want := "[{ssh 2222 22} {mcp 8001 8000} {forward of guest port 3000 3000 3000} {forward of guest port 80 8002 80}]"
	if got != want {
		t.Errorf("forwards %s, want %s", got, want)
	}
}
