package netpolicy

import (
	"context"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/state"
)

var npmPin = egress.Pin{Name: "registry.npmjs.org", Addr: netip.MustParseAddr("203.0.113.80")}

// net show lists the host's pins; a change of the policy writes them into
// the policy file beside it.
func TestShowAndEditCarryThePins(t *testing.T) {
	ctx := context.Background()
	vms := newFakeVMs(t, &state.Record{})
	vms.pins = []egress.Pin{npmPin}
	info, err := Show(ctx, vms, "feat")
	if err != nil || !reflect.DeepEqual(info.Pins, vms.pins) {
		t.Fatalf("net show: %+v, %v; want the pins %v", info, err, vms.pins)
	}
	if _, err := Allow(ctx, vms, "feat", []string{"example.org"}); err != nil {
		t.Fatal(err)
	}
	pol, err := egress.ReadPolicy(DirOf(vms.e.Layout))
	if err != nil || !reflect.DeepEqual(pol.Pins, vms.pins) {
		t.Errorf("the policy after net allow: %+v, %v; want the pins", pol, err)
	}
}

// Refresh gives a running VM's proxy the current pins (its policy written
// again, from its record, and published) and leaves a stopped VM's
// policy alone: its next start writes it.
func TestRefreshGivesRunningVMsThePins(t *testing.T) {
	ctx := context.Background()
	vms := newFakeVMs(t, &state.Record{Net: &state.Net{Mode: egress.ModeAllow, Allow: []string{"example.org"}}})
	if err := Write(vms.e.Layout, vms.e.Record, nil); err != nil {
		t.Fatal(err)
	}
	vms.pins = []egress.Pin{npmPin}

	done, err := Refresh(ctx, vms, []state.Entry{vms.e, {Slug: "unreadable"}})
	if err != nil || len(done) != 0 || vms.published != 0 {
		t.Fatalf("a stopped VM: refreshed %v, published %d, %v; want nothing done", done, vms.published, err)
	}
	if pol, _ := egress.ReadPolicy(DirOf(vms.e.Layout)); len(pol.Pins) != 0 {
		t.Fatalf("a stopped VM's policy got the pins: %+v", pol)
	}

	vms.running = true
	done, err = Refresh(ctx, vms, []state.Entry{vms.e})
	if err != nil || !reflect.DeepEqual(done, []string{"feat"}) || vms.published != 1 {
		t.Fatalf("a running VM: refreshed %v, published %d, %v; want it refreshed once", done, vms.published, err)
	}
	pol, err := egress.ReadPolicy(DirOf(vms.e.Layout))
	if err != nil || !reflect.DeepEqual(pol.Pins, vms.pins) || !reflect.DeepEqual(pol.Allow[len(pol.Allow)-1:], []string{"example.org"}) {
		t.Errorf("the running VM's policy: %+v, %v; want its record's with the pins", pol, err)
	}
}

// A Refresh that cannot write a VM's policy says which VM and how to
// apply the pins anyway.
func TestRefreshFailureNamesTheVM(t *testing.T) {
	vms := newFakeVMs(t, &state.Record{})
	vms.running = true
	if err := os.WriteFile(DirOf(vms.e.Layout), nil, 0o600); err != nil { // a file where the directory goes
		t.Fatal(err)
	}
	done, err := Refresh(context.Background(), vms, []state.Entry{vms.e})
	if len(done) != 0 || err == nil || !strings.Contains(err.Error(), "VM feat's proxy did not get the pins") || !strings.Contains(err.Error(), "`agent-vm restart feat`") {
		t.Errorf("refreshed %v, %v; want an error naming the VM and the restart", done, err)
	}
}
