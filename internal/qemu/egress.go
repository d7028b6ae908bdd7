package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/proc"
)

// The egress proxy's files (see driver.Network and internal/egress).
const (
	EgressPid   = "egress.pid"
	EgressLog   = "egress.log"
	ProxySock   = "egress.sock"
	ExposedSock = "exposed.sock"
	egressFlag  = "--proxy-socket"
	exposedFlag = "--exposed-socket"
	restrictOpt = "restrict=on"
)

// netOpts are the user netdev's options that contain the guest: slirp's
// restrict=on (no gateway, no DNS, no outbound connection but guestfwd's), and
// one guestfwd per port (the proxy's, each exposed one), whose cmd QEMU runs per
// connection with the connection as stdin and stdout. libslirp splits cmd at
// spaces (no shell), so no argument may hold one (checkNetwork). A guestfwd to a
// chardev instead would carry one connection at a time (libslirp hands every
// connection's data to the one chardev and writes replies to the first matching
// socket), so it cannot serve a proxy.
func netOpts(m Machine) []string {
	n := m.Network
	if n == nil {
		return nil
	}
	relay := func(args ...string) string {
		return esc(strings.Join(append(slices.Clone(n.Relay), args...), " "))
	}
	opts := []string{restrictOpt,
		fmt.Sprintf("guestfwd=tcp:%s:%d-cmd:%s", n.Addr, n.ProxyPort, relay(m.egressFile(ProxySock)))}
	for _, p := range n.Exposed {
		opts = append(opts, fmt.Sprintf("guestfwd=tcp:%s:%d-cmd:%s", n.Addr, p, relay(m.egressFile(ExposedSock), strconv.Itoa(p))))
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
		return fmt.Errorf("internal error: incomplete network (addr %q, proxy port %d, proxy %q, relay %q)", n.Addr, n.ProxyPort, n.Proxy, n.Relay)
	}
	for _, a := range append(slices.Clone(n.Relay), m.egressFile(ProxySock)) {
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

// isEgressFor matches the egress proxy of the VM whose QEMU pid file is
// pidFile (the one argument that names the VM wherever its sockets are).
func isEgressFor(pidFile string) func(args []string) bool {
	return func(args []string) bool { return hasArg(args, "--qemu-pidfile", pidFile) }
}

// egressDirMode is the mode of a VM's directory in Launcher.Egress: QEMU's
// relays, running as the workspace's owner, pass through it to the
// sockets; nobody lists it.
const egressDirMode = 0o711

// egressDir is where a VM's egress sockets live when its QEMU drops to the
// workspace's owner: QEMU spawns the guestfwd relays as that user, who may
// not be able to walk to the state directory (root's home, a 0700
// temporary directory). The path is reachable by anyone, but the
// directories are root's and not writable by others, and the sockets are
// the owner's, mode 0600: only the owner (QEMU's relays) and root connect.
// Start makes it (a directory another user made or others can write to is
// refused: Egress is Shared). nil when the launcher has no Egress.
func (l *Launcher) egressDir(uuid string) *hostdir.Dir {
	if l.Egress == nil || uuid == "" {
		return nil
	}
	return l.Egress.Sub(strings.ReplaceAll(uuid, "-", "")[:12], egressDirMode)
}

// relayKeep is how long an unused copy of the relay (installRelay) stays:
// a start that installed it may not have launched its QEMU yet.
const relayKeep = 10 * time.Minute

// installRelay returns a copy of the relay program src that any user can
// run, in base (root's, 0711): under -runas QEMU spawns the relay as the
// workspace's owner, who may not reach src (a binary under root's home, in
// a 0700 build or temporary directory). The copy is named by its content,
// root's and 0755, written by rename so a concurrent start never runs half
// a file. Copies no process names and unused for relayKeep are removed.
func installRelay(base, src string) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("reading the relay program: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading the relay program: %w", err)
	}
	dst := filepath.Join(base, relayPrefix+hex.EncodeToString(h.Sum(nil))[:16])
	now := time.Now()
	if fi, err := os.Lstat(dst); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == 0o755 && ownedByUs(fi) {
		_ = os.Chtimes(dst, now, now)
	} else {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return "", err
		}
		err := atomicfile.WriteFrom(dst, 0o755, func(w io.Writer) error { _, err := io.Copy(w, f); return err })
		if err != nil {
			return "", fmt.Errorf("installing the relay program: %w", err)
		}
	}
	pruneRelays(base, dst, now)
	return dst, nil
}

const relayPrefix = "relay-"

func ownedByUs(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}

// pruneRelays removes the copies in base other than keep that no process
// names in its arguments (a QEMU spawns its relay from its netdev option)
// and that were last installed before relayKeep.
func pruneRelays(base, keep string, now time.Time) {
	des, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, de := range des {
		p := filepath.Join(base, de.Name())
		if !strings.HasPrefix(de.Name(), relayPrefix) || p == keep {
			continue
		}
		fi, err := de.Info()
		if err != nil || !fi.Mode().IsRegular() || now.Sub(fi.ModTime()) < relayKeep {
			continue
		}
		named := func(args []string) bool {
			return slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, p) })
		}
		if proc.Find(named) == 0 {
			_ = os.Remove(p)
		}
	}
}

// startEgress starts the machine's egress proxy and waits for its sockets.
// A proxy left from an earlier run of this VM is ended first. owner, when
// QEMU drops to another user, is given the sockets (mode 0600), so that
// the relays QEMU spawns as that user can connect and no one else can. On
// failure nothing of it runs.
func (l *Launcher) startEgress(ctx context.Context, m Machine, owner *Owner) (int, error) {
	sock, exposed := m.egressFile(ProxySock), m.egressFile(ExposedSock)
	match := isEgressFor(m.runFile(PidFile))
	if old := proc.Find(match); old != 0 {
		proc.Kill(old, match)
	}
	_ = os.Remove(sock) // Start made m.EgressDir
	_ = os.Remove(exposed)
	argv := append(slices.Clone(m.Network.Proxy), egressFlag, sock, exposedFlag, exposed, "--qemu-pidfile", m.runFile(PidFile))
	if owner != nil {
		if err := egress.GiveDir(m.Network.Dir, owner.UID, owner.GID); err != nil {
			return 0, fmt.Errorf("giving the network directory to QEMU's user: %w", err)
		}
		argv = append(argv, "--run-as", strconv.Itoa(owner.UID)+":"+strconv.Itoa(owner.GID))
	}
	p, err := l.Run.Start(execx.Detached{Path: argv[0], Args: argv[1:], StdoutPath: m.logFile(EgressLog), Stdin: m.Network.ProxyInput})
	if err != nil {
		return 0, fmt.Errorf("starting the egress proxy: %w", err)
	}
	wait := newBackoff(10*time.Millisecond, 200*time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if exists(sock) && exists(exposed) {
			if err := giveSockets(owner, sock, exposed); err != nil {
				proc.Kill(p.Pid(), match)
				return 0, fmt.Errorf("giving the egress sockets to QEMU's user: %w", err)
			}
			if err := os.WriteFile(m.runFile(EgressPid), []byte(strconv.Itoa(p.Pid())+"\n"), 0o600); err != nil {
				proc.Kill(p.Pid(), match)
				return 0, err
			}
			return p.Pid(), nil
		}
		select {
		case <-p.Exited():
			return 0, fmt.Errorf("the egress proxy exited at once (code %d): %s", p.ExitCode(), driver.TailFile(m.logFile(EgressLog), 3))
		case <-ctx.Done():
			proc.Kill(p.Pid(), match)
			return 0, ctx.Err()
		case <-time.After(wait.next()):
		}
		if time.Now().After(deadline) {
			proc.Kill(p.Pid(), match)
			return 0, fmt.Errorf("the egress proxy did not create its sockets within 10s: %s", driver.TailFile(m.logFile(EgressLog), 3))
		}
	}
}

// giveSockets makes the sockets (or any files) owner's (Lchown: the proxy
// made them in a directory of ours, but a link is never followed). Their
// modes stay.
func giveSockets(owner *Owner, socks ...string) error {
	if owner == nil {
		return nil
	}
	for _, s := range socks {
		if err := os.Lchown(s, owner.UID, owner.GID); err != nil {
			return err
		}
	}
	return nil
}

// stopEgress ends the machine's egress proxy (the one recorded, or any
// serving this VM) and removes its sockets, wherever they were made.
func (l *Launcher) stopEgress(m Machine) {
	match := isEgressFor(m.runFile(PidFile))
	pid, err := proc.ReadPid(m.runFile(EgressPid))
	if err != nil || !proc.Verified(pid, match) {
		pid = proc.Find(match)
	}
	if pid != 0 {
		proc.Kill(pid, match)
	}
	_ = os.Remove(m.runFile(EgressPid))
	_ = os.Remove(m.sockFile(ProxySock))
	_ = os.Remove(m.sockFile(ExposedSock))
	if d := l.egressDir(m.UUID); d != nil {
		dir := d.Path
		_ = os.Remove(filepath.Join(dir, ProxySock))
		_ = os.Remove(filepath.Join(dir, ExposedSock))
		_ = os.Remove(dir)
	}
	if m.EgressDir != "" {
		_ = os.Remove(m.egressFile(ProxySock))
		_ = os.Remove(m.egressFile(ExposedSock))
		_ = os.Remove(m.EgressDir)
	}
}
