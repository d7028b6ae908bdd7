// Package ports picks the host ports a VM forwards (SSH, MCP and the
// user's own forwards). Every
// forward binds 127.0.0.1 only; a port is free when no VM record holds it and
// nothing on this machine listens on it.
package ports

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Range is an inclusive port range.
type Range struct{ Lo, Hi int }

// The ranges agent-vm allocates from. The MCP range starts at seed 002's 8000.
func SSHRange() Range { return Range{Lo: 2222, Hi: 2999} }
func MCPRange() Range { return Range{Lo: 8000, Hi: 8999} }

// Probe reports whether a port can be bound on 127.0.0.1 right now.
type Probe func(port int) bool

// Listenable is the real Probe: it binds 127.0.0.1:port and lets go at once.
func Listenable(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// Pick returns the lowest port in r that is not in taken and passes probe.
func Pick(r Range, taken map[int]string, probe Probe) (int, error) {
	for p := r.Lo; p <= r.Hi; p++ {
		if _, ok := taken[p]; ok {
			continue
		}
		if probe(p) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port in %d-%d on 127.0.0.1 (hint: destroy VMs you no longer need, or free a port in that range)", r.Lo, r.Hi)
}

// ErrTaken means a requested port is not available.
var ErrTaken = errors.New("port taken")

// Check tells whether a specific port (e.g. --port) can be used, and why not.
func Check(port int, taken map[int]string, probe Probe) error {
	return CheckAs(port, "--port", taken, probe)
}

// CheckAs is Check for a port the user gave as what (a flag, "HOST_PORT"),
// which its hints name.
func CheckAs(port int, what string, taken map[int]string, probe Probe) error {
	if port < 1024 || port > 65535 {
		return fmt.Errorf("port %d is out of range (hint: use a port between 1024 and 65535)", port)
	}
	if owner, ok := taken[port]; ok {
		return fmt.Errorf("port %d is already used by %s (hint: choose another %s or leave it out to get a free one): %w", port, owner, what, ErrTaken)
	}
	if !probe(port) {
		return fmt.Errorf("port %d is already in use on 127.0.0.1 by another program (hint: stop it, or choose another %s): %w", port, what, ErrTaken)
	}
	return nil
}

// ForwardRange is where a forward of a guest port (`agent-vm port add`)
// gets its host port when the guest port's own number is not free: the
// range MCP ports come from, so one allocation scheme covers every port
// agent-vm binds.
func ForwardRange() Range { return MCPRange() }

// CheckForward fails, naming the port, what it forwards (name) and the
// fix, when host port is not free on 127.0.0.1 right before a VM binds it.
// A port is given up to within to come free: a process that just exited
// (this VM's QEMU or forwarder of a run before) can hold its listening
// socket briefly after it is gone.
func CheckForward(port int, name string, probe Probe, within time.Duration) error {
	delay, deadline := 20*time.Millisecond, time.Now().Add(within)
	for !probe(port) {
		if !time.Now().Before(deadline) {
			return fmt.Errorf("port %d (%s) is already in use on 127.0.0.1 by another program (hint: stop that program; `ss -ltnp 'sport = :%d'` shows it): %w", port, name, port, ErrTaken)
		}
		time.Sleep(delay)
		delay = min(delay*2, 250*time.Millisecond)
	}
	return nil
}
