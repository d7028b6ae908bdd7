package libvirt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/testutil"
	golibvirt "github.com/digitalocean/go-libvirt"
)

type otherBoot struct{}

func (otherBoot) DriverName() string { return "qemu" }

// A start the driver cannot make is refused before it runs anything or
// reaches libvirt: another driver's plan, another user than root (the
// network and its fence need root), a machine without a network (the
// driver runs only contained machines). Each says what and why.
func TestStartRefusesBeforeDoingAnything(t *testing.T) {
	run := execxtest.New(t) // fake at the exec boundary: records what it was asked
	root := func() int { return 0 }
	m := driver.Machine{Name: "agent-vm-feat", UUID: "0123abcd-0000", RunDir: t.TempDir(), LogsDir: t.TempDir(),
		Network: &driver.Network{Addr: "10.0.2.100", ProxyPort: 3128, Proxy: []string{"agent-vm", "net-proxy"}}}
	handoff := &hostdir.Dir{Path: t.TempDir(), Mode: 0o711}
	for _, tc := range []struct {
		name string
		d    *Driver
		m    driver.Machine
		b    driver.Boot
		want string
	}{
		{"another driver's plan", &Driver{Run: run, Euid: root, Handoff: handoff, Pool: "/p"}, m, otherBoot{}, `cannot run a plan for the "qemu" driver`},
		{"not root", &Driver{Run: run, Euid: func() int { return 1000 }, Handoff: handoff, Pool: "/p"}, m, Boot{}, "only root can make"},
		{"no network", &Driver{Run: run, Euid: root, Handoff: handoff, Pool: "/p"}, driver.Machine{Name: "x", UUID: "u"}, Boot{}, "only contained machines"},
		{"no seed", &Driver{Run: run, Euid: root, Handoff: handoff, Pool: "/p"}, m, Boot{Seed: "/no/such/seed.iso"}, "the seed"},
	} {
		_, err := tc.d.Start(context.Background(), tc.m, tc.b, driver.StartOptions{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		if errors.Is(err, driver.ErrRunning) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if len(run.Calls()) != 0 {
		t.Errorf("refused starts ran %v", run.Calls())
	}
}

// Each forward process is found by the VM's run directory and its port,
// never another VM's or another port's.
func TestForwarderMatch(t *testing.T) {
	m := driver.Machine{RunDir: "/s/feat/run"}
	args := []string{"/usr/bin/agent-vm", "net-forward", "--tag", "/s/feat/run", "--pidfile", "/run/x.pid", "--forward", "2222=10.213.0.2:22"}
	if !isForwarderFor(m, 2222)(args) || !isForwarderFor(m, 0)(args) {
		t.Error("its own forward not matched")
	}
	if isForwarderFor(m, 222)(args) || isForwarderFor(driver.Machine{RunDir: "/s/other/run"}, 0)(args) {
		t.Error("matched another port or another VM's forward")
	}
	if isForwarderFor(m, 0)([]string{"/usr/bin/agent-vm", "net-proxy", "--tag", "/s/feat/run"}) {
		t.Error("matched another command")
	}
}

// A machine's state from libvirt's and the driver's marks: a killed QEMU
// (libvirt: shut off, destroyed) after a start with no clean stop is
// crashed; the same after agent-vm's stop, or a guest that powered itself
// off, is stopped; a domain paused by agent-vm's suspend is suspended in
// place, paused by something else only paused; one being shut down still
// runs.
func TestStateOf(t *testing.T) {
	destroyed, byGuest := int32(golibvirt.DomainShutoffDestroyed), int32(golibvirt.DomainShutoffShutdown)
	for _, tc := range []struct {
		name                       string
		st                         golibvirt.DomainState
		reason                     int32
		launched, clean, suspended bool
		want, suspend              string
	}{
		{"running", golibvirt.DomainRunning, 0, true, false, false, driver.StateRunning, ""},
		{"shutting down", golibvirt.DomainShutdown, 0, true, false, false, driver.StateRunning, ""},
		{"killed QEMU", golibvirt.DomainShutoff, destroyed, true, false, false, driver.StateCrashed, ""},
		{"stopped by agent-vm", golibvirt.DomainShutoff, destroyed, true, true, false, driver.StateStopped, ""},
		{"guest powered off", golibvirt.DomainShutoff, byGuest, true, false, false, driver.StateStopped, ""},
		{"never started", golibvirt.DomainNostate, 0, false, false, false, driver.StateStopped, ""},
		{"defined, never launched", golibvirt.DomainShutoff, 0, false, false, false, driver.StateStopped, ""},
		{"suspended", golibvirt.DomainPaused, 0, true, false, true, driver.StateSuspended, driver.SuspendPaused},
		{"paused by another", golibvirt.DomainPaused, 0, true, false, false, driver.StatePaused, ""},
		{"crashed", golibvirt.DomainCrashed, 0, true, false, false, driver.StateCrashed, ""},
	} {
		st, suspend, _ := stateOf(tc.st, tc.reason, tc.launched, tc.clean, tc.suspended)
		if st != tc.want || suspend != tc.suspend {
			t.Errorf("%s: %q %q, want %q %q", tc.name, st, suspend, tc.want, tc.suspend)
		}
	}
}

// RemoveForward returns once the host port is closed; a port that still
// listens after the forward's process was stopped (here a listener of the
// test's, which no forwarder owns) is an error naming it, not a success.
func TestRemoveForwardWaitsForThePort(t *testing.T) {
	d := &Driver{}
	m := driver.Machine{RunDir: t.TempDir()}
	free := testutil.FreePort(t)
	if err := d.RemoveForward(context.Background(), m, driver.Forward{Host: free, Guest: 80}); err != nil {
		t.Errorf("a closed port: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := ln.Addr().(*net.TCPAddr).Port
	err = d.RemoveForward(context.Background(), m, driver.Forward{Host: held, Guest: 80})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("127.0.0.1:%d still listens", held)) {
		t.Errorf("a port that stays open: %v; want it named", err)
	}
}

// A forward is started when its own process says it listens, not when
// the port answers: a program that took the port after the start's check
// would answer too, the forwarder would end, and the wait for SSH would
// knock on that program's port for ever. Real `agent-vm __net-forward`
// processes: one on a free port is up; one on a port a listener of the
// test's holds fails the start with ports.ErrTaken, naming the port.
func TestStartForwardWaitsForItsOwnListener(t *testing.T) {
	exe := testutil.AgentVMBinary(t)
	d := &Driver{Run: execx.OS{}, Executable: func() (string, error) { return exe, nil }}
	m := driver.Machine{RunDir: t.TempDir(), LogsDir: t.TempDir()}
	t.Cleanup(func() { d.stopForwards(m, 0) })
	guest := netip.MustParseAddr("127.0.0.1")
	free := testutil.FreePort(t)
	if err := d.startForward(context.Background(), m, guest, driver.Forward{Name: "ssh", Host: free, Guest: 22}); err != nil {
		t.Fatalf("a free port: %v", err)
	}
	if d.portFree(free) {
		t.Errorf("the forward's start returned, and nothing listens on %d", free)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := ln.Addr().(*net.TCPAddr).Port
	err = d.startForward(context.Background(), m, guest, driver.Forward{Name: "mcp", Host: held, Guest: 8765})
	if !errors.Is(err, ports.ErrTaken) || !strings.Contains(err.Error(), fmt.Sprintf("port %d (mcp)", held)) {
		t.Errorf("a port another program holds: %v; want ports.ErrTaken naming it", err)
	}
}
