package qemu

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/ports"
)

// listens reports whether something accepts connections on 127.0.0.1:port.
func listens(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// A real QEMU: a forward added while it runs makes the host port listen
// (slirp accepts on it), a taken host port is refused naming it, and
// removing the forward frees the port; removing it again is no error.
func TestAddAndRemoveForwardOnARealQEMU(t *testing.T) {
	l := testLauncher(t)
	m, b := testMachine(t)
	ctx := context.Background()
	f := driver.Forward{Name: "forward of guest port 3000", Guest: 3000}
	f.Host, _ = ports.Pick(ports.Range{Lo: 31000, Hi: 31999}, nil, ports.Listenable)

	if err := l.AddForward(ctx, m, f); !errors.Is(err, driver.ErrNotRunning) {
		t.Fatalf("before the start: got %v, want ErrNotRunning", err)
	}
	launch := mustStart(t, l, m, b, StartOptions{Accel: "tcg"})
	if launch.Netdev != DirectNetdev {
		t.Errorf("launch records netdev %q, want %q", launch.Netdev, DirectNetdev)
	}
	if listens(f.Host) {
		t.Fatalf("port %d listens before the forward is added", f.Host)
	}
	if err := l.AddForward(ctx, m, f); err != nil {
		t.Fatal(err)
	}
	if !listens(f.Host) {
		t.Fatalf("port %d does not listen after AddForward", f.Host)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().(*net.TCPAddr).Port
	err = l.AddForward(ctx, m, driver.Forward{Guest: 3001, Host: busy})
	if !errors.Is(err, ports.ErrTaken) || !strings.Contains(err.Error(), "port "+itoa(busy)+" ") {
		t.Errorf("a taken host port: got %v, want a port-taken error naming port %d", err, busy)
	}

	if err := l.RemoveForward(ctx, m, f); err != nil {
		t.Fatal(err)
	}
	if listens(f.Host) {
		t.Errorf("port %d still listens after RemoveForward", f.Host)
	}
	if err := l.RemoveForward(ctx, m, f); err != nil {
		t.Errorf("removing it again: %v", err)
	}
	// The SSH forward the start made is untouched.
	if !listens(m.Forwards[0].Host) {
		t.Errorf("the start's own forward (port %d) no longer listens", m.Forwards[0].Host)
	}
}

// A launch without a recorded netdev (an older agent-vm's) cannot change
// its forwards: the error says to restart.
func TestForwardNeedsTheRecordedNetdev(t *testing.T) {
	l, m, _, launch := fakeStart(t, "")
	err := l.AddForward(context.Background(), m, driver.Forward{Guest: 3000, Host: 31000})
	if launch.Netdev != "" || err == nil || !strings.Contains(err.Error(), "restart the VM") {
		t.Errorf("netdev %q: got %v, want an error saying to restart the VM", launch.Netdev, err)
	}
	_ = l.Stop(context.Background(), m, 5*time.Second)
}

// A run script gets the machine's forwards its own command line lacks
// through QEMU_NET_OPTS, and records its netdev.
func TestScriptGetsTheOtherForwardsInQEMUNetOpts(t *testing.T) {
	m := sampleMachine()
	m.Network = nil // TestNetworkIsContained has the network's options
	m.Forwards = append(m.Forwards, driver.Forward{Host: 3000, Guest: 3000}, driver.Forward{Host: 8002, Guest: 80})
	s := &Script{Path: "/nix/store/x/bin/run-x-vm", Env: []string{"PATH=/bin"}, Netdev: "user.0", Forwarded: []int{2222, 8000}}
	want := "hostfwd=tcp:127.0.0.1:3000-:3000,hostfwd=tcp:127.0.0.1:8002-:80"
	if got := ScriptNetOpts(m, s); got != want {
		t.Errorf("QEMU_NET_OPTS %q, want %q", got, want)
	}
	l := &Launcher{}
	d := l.detached(m, Boot{Script: s}, "tcg", driver.Share9p, Hardening{}, false)
	if !slices.Contains(d.Env, "QEMU_NET_OPTS="+want) || !slices.Contains(d.Env, "PATH=/bin") {
		t.Errorf("script env %q lacks QEMU_NET_OPTS=%s", d.Env, want)
	}
	if len(s.Env) != 1 {
		t.Errorf("detached changed the plan's env: %q", s.Env)
	}
	s.Forwarded = []int{2222, 8000, 3000, 8002}
	if d := l.detached(m, Boot{Script: s}, "tcg", driver.Share9p, Hardening{}, false); slices.ContainsFunc(d.Env, func(e string) bool { return strings.HasPrefix(e, "QEMU_NET_OPTS=") }) {
		t.Errorf("no forward left to add, but the env has %q", d.Env)
	}
	if (Boot{Script: s}).netdev() != "user.0" {
		t.Error("a script boot's netdev is not the script's")
	}
}
