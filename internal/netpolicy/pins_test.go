package netpolicy

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
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
// again, from its record, and published), rewrites a stopped VM's policy
// without publishing it, and leaves a VM that never started (no policy)
// alone: its first start writes it.
func TestRefreshGivesTheVMsThePins(t *testing.T) {
	ctx := context.Background()
	vms := newFakeVMs(t, &state.Record{Net: &state.Net{Mode: egress.ModeAllow, Allow: []string{"example.org"}}})
	vms.pins = []egress.Pin{npmPin}
	if done, err := Refresh(ctx, vms, []state.Entry{vms.e, {Slug: "unreadable"}}); err != nil || len(done) != 0 {
		t.Fatalf("a VM without a policy: refreshed %v, %v", done, err)
	}
	if _, err := os.Stat(DirOf(vms.e.Layout)); err == nil {
		t.Fatal("Refresh wrote the policy of a VM that never started")
	}

	if err := Write(vms.e.Layout, vms.e.Record, nil); err != nil {
		t.Fatal(err)
	}
	done, err := Refresh(ctx, vms, []state.Entry{vms.e})
	pol, _ := egress.ReadPolicy(DirOf(vms.e.Layout))
	if err != nil || len(done) != 0 || vms.published != 0 || !reflect.DeepEqual(pol.Pins, vms.pins) {
		t.Fatalf("a stopped VM: refreshed %v, published %d, pins %v, %v; want its policy rewritten, not published", done, vms.published, pol.Pins, err)
	}

	vms.running = true
	vms.pins = append(vms.pins, egress.Pin{Name: "deb.debian.org", Addr: npmPin.Addr})
	done, err = Refresh(ctx, vms, []state.Entry{vms.e})
	if err != nil || !reflect.DeepEqual(done, []string{"feat"}) || vms.published != 1 {
		t.Fatalf("a running VM: refreshed %v, published %d, %v; want it refreshed once", done, vms.published, err)
	}
	pol, err = egress.ReadPolicy(DirOf(vms.e.Layout))
	if err != nil || !reflect.DeepEqual(pol.Pins, vms.pins) || !reflect.DeepEqual(pol.Allow[len(pol.Allow)-1:], []string{"example.org"}) {
		t.Errorf("the running VM's policy: %+v, %v; want its record's with the pins", pol, err)
	}
}

// A VM whose lock another command holds is not waited for, nor one whose
// policy cannot be written: Refresh says which VM, and how to apply the
// pins anyway.
func TestRefreshFailureNamesTheVM(t *testing.T) {
	ctx := context.Background()
	vms := newFakeVMs(t, &state.Record{})
	vms.running = true
	if err := Write(vms.e.Layout, vms.e.Record, nil); err != nil {
		t.Fatal(err)
	}
	lock, err := state.AcquireLock(ctx, filepath.Join(vms.e.Layout.Dir, "lock"))
	if err != nil {
		t.Fatal(err)
	}
	done, err := Refresh(ctx, vms, []state.Entry{vms.e})
	lock.Release()
	if len(done) != 0 || err == nil || !strings.Contains(err.Error(), "VM feat's proxy did not get the pins: another agent-vm command holds it") || !strings.Contains(err.Error(), "`agent-vm restart feat`") {
		t.Errorf("a busy VM: refreshed %v, %v; want an error naming the VM and the restart", done, err)
	}
	// A directory where the policy file goes: no write replaces it.
	policy := filepath.Join(DirOf(vms.e.Layout), egress.PolicyFile)
	if err := os.Remove(policy); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(policy, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(policy, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if done, err := Refresh(ctx, vms, []state.Entry{vms.e}); len(done) != 0 || err == nil || !strings.Contains(err.Error(), "VM feat's proxy did not get the pins") {
		t.Errorf("an unwritable policy: refreshed %v, %v", done, err)
	}
}
