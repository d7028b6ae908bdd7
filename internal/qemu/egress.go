package qemu

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
)

// The egress proxy's files (see driver.Network and internal/egress).
const (
	EgressPid   = "egress.pid"
	EgressLog   = "egress.log"
	ProxySock   = "egress.sock"
	DoorSock    = "door.sock"
	egressFlag  = "--proxy-socket"
	doorFlag    = "--door-socket"
	restrictOpt = "restrict=on"
)

// netOpts are the user netdev's options that contain the guest: slirp's
// restrict=on (no gateway, no DNS, no outbound connection but guestfwd's),
// and one guestfwd per door, whose cmd QEMU runs per connection with the
// connection as stdin and stdout. libslirp splits cmd at spaces (no shell),
// so no argument may hold one (checkNetwork). A guestfwd to a chardev
// instead would carry one connection at a time (libslirp hands every
// connection's data to the one chardev and writes replies to the first
// matching socket), so it cannot serve a proxy.
func netOpts(m Machine) []string {
	n := m.Network
	if n == nil {
		return nil
	}
	relay := func(args ...string) string {
		return esc(strings.Join(append(slices.Clone(n.Relay), args...), " "))
	}
	opts := []string{restrictOpt,
		fmt.Sprintf("guestfwd=tcp:%s:%d-cmd:%s", n.Addr, n.ProxyPort, relay(m.sockFile(ProxySock)))}
	for _, p := range n.Exposed {
		opts = append(opts, fmt.Sprintf("guestfwd=tcp:%s:%d-cmd:%s", n.Addr, p, relay(m.sockFile(DoorSock), strconv.Itoa(p))))
	}
	return opts
}

// checkNetwork refuses a network the command line cannot carry.
func checkNetwork(m Machine) error {
	n := m.Network
	if n == nil {
		return nil
	}
	if len(n.Proxy) == 0 || len(n.Relay) == 0 || n.Addr == "" || n.ProxyPort == 0 {
		return fmt.Errorf("internal error: incomplete network %+v", *n)
	}
	for _, a := range append(slices.Clone(n.Relay), m.sockFile(ProxySock)) {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\") {
			return fmt.Errorf("QEMU's guestfwd cannot run %q: its path holds a space or a quote (hint: install agent-vm, and keep its state directory, at paths without them)", a)
		}
	}
	for _, p := range n.Exposed {
		if p == n.ProxyPort {
			return fmt.Errorf("host port %d cannot be exposed: the guest reaches the egress proxy there", p)
		}
	}
	return nil
}

// isEgressFor matches the egress proxy serving this socket.
func isEgressFor(sock string) func(args []string) bool {
	return func(args []string) bool { return hasArg(args, egressFlag, sock) }
}

// startEgress starts the machine's egress proxy and waits for its sockets.
// A proxy left from an earlier run of this VM is ended first. On failure
// nothing of it runs.
func (l *Launcher) startEgress(ctx context.Context, m Machine) (int, error) {
	sock, door := m.sockFile(ProxySock), m.sockFile(DoorSock)
	match := isEgressFor(sock)
	if old := findProcess(match); old != 0 {
		killVerified(old, match)
	}
	_ = os.Remove(sock)
	_ = os.Remove(door)
	argv := append(slices.Clone(m.Network.Proxy), egressFlag, sock, doorFlag, door, "--qemu-pidfile", m.runFile(PidFile))
	p, err := l.Run.Start(execx.Detached{Path: argv[0], Args: argv[1:], StdoutPath: m.logFile(EgressLog)})
	if err != nil {
		return 0, fmt.Errorf("starting the egress proxy: %w", err)
	}
	wait := newBackoff(10*time.Millisecond, 200*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if exists(sock) && exists(door) {
			if err := os.WriteFile(m.runFile(EgressPid), []byte(strconv.Itoa(p.Pid())+"\n"), 0o600); err != nil {
				killVerified(p.Pid(), match)
				return 0, err
			}
			return p.Pid(), nil
		}
		select {
		case <-p.Exited():
			return 0, fmt.Errorf("the egress proxy exited at once (code %d): %s", p.ExitCode(), driver.TailFile(m.logFile(EgressLog), 3))
		case <-ctx.Done():
			killVerified(p.Pid(), match)
			return 0, ctx.Err()
		case <-time.After(wait.next()):
		}
		if time.Now().After(deadline) {
			killVerified(p.Pid(), match)
			return 0, fmt.Errorf("the egress proxy did not create its sockets within 10s: %s", driver.TailFile(m.logFile(EgressLog), 3))
		}
	}
}

// stopEgress ends the machine's egress proxy (the one recorded, or any
// serving its socket) and removes its sockets.
func (l *Launcher) stopEgress(m Machine) {
	sock := m.sockFile(ProxySock)
	match := isEgressFor(sock)
	pid, err := readPid(m.runFile(EgressPid))
	if err != nil || !verified(pid, match) {
		pid = findProcess(match)
	}
	if pid != 0 {
		killVerified(pid, match)
	}
	_ = os.Remove(m.runFile(EgressPid))
	_ = os.Remove(sock)
	_ = os.Remove(m.sockFile(DoorSock))
}
