package testutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// netns is a network namespace of a test's own, joined to the root
// namespace by a veth pair on a /30 of 198.18.0.0/15, the benchmarking
// block: nothing real lives there, and the egress proxy refuses it unless
// the address itself is allowed.
type netns struct {
	ip   string     // the ip program
	name string     // the namespace, bound at /run/netns/<name>
	link string     // the veth's end in the root namespace
	host netip.Addr // link's address, the /30's first
	peer netip.Addr // the address of the end in the namespace (peerLink)
}

const (
	netnsDir    = "/run/netns"
	netnsPrefix = "agent-vm-test-" // + "<pid>-<seq>"
	linkPrefix  = "avt"            // + "<pid>-<seq>", within the kernel's 15 bytes
	peerLink    = "up0"
)

var (
	netnsSeq atomic.Int64
	// subnetMu keeps a process's parallel tests from taking one /30 twice.
	subnetMu sync.Mutex
	// benchmarking is the block the namespaces' /30s come from.
	benchmarking = netip.MustParsePrefix("198.18.0.0/15")
)

// newNetns makes a network namespace named for the process and a
// sequence number, and a veth pair into it: its root end, the host's, has
// the /30's first address, its end in the namespace the second; both and
// the namespace's lo are up. A namespace of the same name left by a
// crashed run is removed first, as are those of processes no longer
// running (sweepNetns). The test's cleanup removes the namespace and the
// pair, also when it fails.
func newNetns(t testing.TB) *netns {
	t.Helper()
	Need(t, os.Geteuid() == 0, "a network namespace needs root")
	ip := Program(t, "ip")
	sweepNetns(t, ip)
	pid, seq := os.Getpid(), netnsSeq.Add(1)
	ns := &netns{ip: ip, name: fmt.Sprintf("%s%d-%d", netnsPrefix, pid, seq), link: fmt.Sprintf("%s%d-%d", linkPrefix, pid, seq)}
	if len(ns.link) > unix.IFNAMSIZ-1 {
		t.Fatalf("the link name %q is longer than the kernel takes", ns.link)
	}
	if err := ns.remove(); err != nil {
		t.Fatalf("removing a leftover of a crashed run: %v", err)
	}
	t.Cleanup(func() {
		if err := ns.remove(); err != nil {
			t.Errorf("removing the test's network namespace: %v", err)
		}
	})
	if out, err := exec.Command(ip, "netns", "add", ns.name).CombinedOutput(); err != nil {
		SkipOrFail(t, "cannot make a network namespace: %v: %s", err, out)
	}
	ns.run(t, "link", "add", ns.link, "type", "veth", "peer", "name", peerLink, "netns", ns.name)
	ns.address(t, int(int64(pid)*16+seq))
	ns.run(t, "link", "set", ns.link, "up")
	ns.run(t, "-n", ns.name, "addr", "add", ns.peer.String()+"/30", "dev", peerLink)
	ns.run(t, "-n", ns.name, "link", "set", peerLink, "up")
	ns.run(t, "-n", ns.name, "link", "set", "lo", "up")
	return ns
}

// address picks a free /30 (freeSubnet, from start on) and gives the
// root end its first address.
func (ns *netns) address(t testing.TB, start int) {
	t.Helper()
	subnetMu.Lock()
	defer subnetMu.Unlock()
	ns.host, ns.peer = freeSubnet(t, start)
	ns.run(t, "addr", "add", ns.host.String()+"/30", "dev", ns.link)
}

func (ns *netns) run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(ns.ip, args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// remove deletes the pair and the namespace, those that exist. The
// namespace itself lives on while a socket made in it is open.
func (ns *netns) remove() error {
	var errs []error
	if _, err := net.InterfaceByName(ns.link); err == nil {
		if out, err := exec.Command(ns.ip, "link", "del", ns.link).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %v: %s", ns.link, err, out))
		}
	}
	if _, err := os.Stat(filepath.Join(netnsDir, ns.name)); err == nil {
		if out, err := exec.Command(ns.ip, "netns", "del", ns.name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %v: %s", ns.name, err, out))
		}
	}
	return errors.Join(errs...)
}

// sweepNetns removes what test processes that died without their
// cleanups (killed, or ended by go test's -timeout) left: the namespaces
// named for a pid no longer running, and their links.
func sweepNetns(t testing.TB, ip string) {
	t.Helper()
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return // none yet
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), netnsPrefix)
		pidText, _, ok2 := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || !ok2 || err != nil || running(pid) {
			continue
		}
		ns := &netns{ip: ip, name: e.Name(), link: linkPrefix + rest}
		if err := ns.remove(); err != nil {
			t.Logf("removing a dead test process's network namespace: %v", err)
		}
	}
}

// running says whether a process pid exists.
func running(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// freeSubnet picks a /30 of 198.18.0.0/15 that no network on the host's
// interfaces overlaps, trying the start'th first, then the next: start
// comes from the pid and the sequence number, so parallel tests and test
// processes begin apart. It returns the /30's two usable addresses.
func freeSubnet(t testing.TB, start int) (first, second netip.Addr) {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var taken []netip.Prefix
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ip, _ := netip.AddrFromSlice(n.IP)
			ones, _ := n.Mask.Size()
			if p := netip.PrefixFrom(ip.Unmap(), ones).Masked(); p.Overlaps(benchmarking) {
				taken = append(taken, p)
			}
		}
	}
	base := benchmarking.Addr().As4()
	slots := 1 << (32 - benchmarking.Bits() - 2)
	for i := range slots {
		n := uint32((start+i)%slots) * 4
		a := netip.AddrFrom4([4]byte{base[0], base[1] + byte(n>>16), byte(n >> 8), byte(n)})
		p := netip.PrefixFrom(a, 30)
		if !overlapsAny(p, taken) {
			return a.Next(), a.Next().Next()
		}
	}
	t.Fatalf("no free /30 in %s", benchmarking)
	return
}

func overlapsAny(p netip.Prefix, ps []netip.Prefix) bool {
	for _, q := range ps {
		if p.Overlaps(q) {
			return true
		}
	}
	return false
}

// listen opens a TCP listener in the namespace for each of addrs
// (ListenInNetns).
func (ns *netns) listen(addrs ...string) ([]net.Listener, error) {
	return ListenInNetns(ns.name, addrs...)
}

// ListenInNetns opens a TCP listener in the network namespace name
// (/run/netns/name) for each of addrs. Only a goroutine locked to its
// thread enters the namespace, and it leaves again before it unlocks;
// should leaving fail, the thread is never unlocked and ends with the
// goroutine. A socket stays in the namespace it was made in, so the
// listeners accept there whichever goroutine serves them.
func ListenInNetns(name string, addrs ...string) ([]net.Listener, error) {
	type result struct {
		ls  []net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		ls, left, err := listenLocked(name, addrs)
		if left {
			runtime.UnlockOSThread()
		}
		done <- result{ls, err}
	}()
	r := <-done
	return r.ls, r.err
}

// listenLocked is ListenInNetns's work on the locked thread; left says
// whether the thread is back in the namespace it started in.
func listenLocked(name string, addrs []string) (ls []net.Listener, left bool, err error) {
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, err
	}
	defer orig.Close()
	target, err := os.Open(filepath.Join(netnsDir, name))
	if err != nil {
		return nil, true, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("entering the network namespace %s: %w", name, err)
	}
	for _, a := range addrs {
		l, lerr := net.Listen("tcp", a)
		if lerr != nil {
			err = lerr
			break
		}
		ls = append(ls, l)
	}
	serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET)
	if serr != nil {
		err = errors.Join(err, fmt.Errorf("leaving the network namespace %s: %w", name, serr))
	}
	if err != nil {
		for _, l := range ls {
			l.Close()
		}
		return nil, serr == nil, err
	}
	return ls, true, nil
}
