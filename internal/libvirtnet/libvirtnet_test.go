package libvirtnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/hostlink/hostlinktest"
	"github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
)

var proxyAddr = netip.MustParseAddr("10.0.2.100")

func TestCandidatesStayInPoolAndDiffer(t *testing.T) {
	seen := map[netip.Prefix]bool{}
	for i := range 64 {
		n := Candidate("agent-vm-feat-0123abcd", "0123abcd", "52:54:00:01:02:03", proxyAddr, i)
		if err := n.validate(); err != nil {
			t.Fatal(err)
		}
		if !Pool.Contains(n.Subnet.Addr()) || n.Subnet.Bits() != 29 || seen[n.Subnet] || n.Host != n.Subnet.Addr().Next() || n.Guest != n.Host.Next() {
			t.Fatalf("candidate %d: %+v", i, n)
		}
		seen[n.Subnet] = true
	}
	a := Candidate("a", "0123abcd", "52:54:00:01:02:03", proxyAddr, 0)
	b := Candidate("b", "89abcdef", "52:54:00:01:02:03", proxyAddr, 0)
	if a.Subnet == b.Subnet {
		t.Errorf("two VMs start at one subnet %s", a.Subnet)
	}
}

func TestXMLAndRuleset(t *testing.T) {
	n := Net{Name: "agent-vm-feat-0123abcd", Bridge: "avm-0123abcd", Subnet: netip.MustParsePrefix("10.213.7.8/29"),
		Host: netip.MustParseAddr("10.213.7.9"), Guest: netip.MustParseAddr("10.213.7.10"), MAC: "52:54:00:01:02:03", ProxyAddr: proxyAddr}
	x, err := n.XML()
	if err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, "testdata/network.xml", []byte(x))
	rs, err := n.Ruleset("0123abcd", Front{ProxyPort: 3128, Proxy: 40001, Exposed: map[int]int{8080: 40003, 5000: 40002}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, "testdata/fence.nft", []byte(rs))
	for _, bad := range []Net{
		func() Net { m := n; m.Name = "a'b"; return m }(),
		func() Net { m := n; m.Bridge = "avm-0123456789abcdef"; return m }(),
		func() Net { m := n; m.MAC = "52:54:00:01:02:03'"; return m }(),
		func() Net { m := n; m.ProxyAddr = netip.MustParseAddr("10.213.7.12"); return m }(),
	} {
		if _, err := bad.XML(); err == nil {
			t.Errorf("XML of %+v: no error", bad)
		}
	}
	for _, f := range []Front{{ProxyPort: 3128}, {ProxyPort: 3128, Proxy: 1, Exposed: map[int]int{3128: 2}}, {ProxyPort: 3128, Proxy: 1, Exposed: map[int]int{0: 2}}} {
		if _, err := n.Ruleset("0123abcd", f); err == nil {
			t.Errorf("Ruleset of %+v: no error", f)
		}
	}
}

// The real thing, as root with libvirtd and nft: a network made by libvirt,
// fenced by nftables, and a "guest" that is a network namespace on the VM's
// bridge (its veth's MAC the reservation's, its address and route those DHCP
// would hand out). From it: the proxy address leads to the proxy's and the
// exposed port's listeners on the bridge, and nothing else of the host answers,
// at the bridge's address or any other of the host's, nor does the front answer
// when called directly; the host still reaches the guest. Down leaves nothing.
func TestFenceHoldsForReal(t *testing.T) {
	testutil.Need(t, os.Geteuid() == 0, "a libvirt network and an nftables table need root")
	nft := testutil.Program(t, NFT)
	ipProg := testutil.Program(t, "ip")
	d := libvirtd.ForTest(t)
	_ = d
	l := Libvirt{Run: execx.OS{}, URI: libvirtd.URI}
	id := randomID(t)
	name := "agent-vm-test-" + id
	mac := "52:54:00:" + id[0:2] + ":" + id[2:4] + ":" + id[4:6]
	ctx := context.Background()
	t.Cleanup(func() {
		if err := l.Down(context.Background(), name, TableName(id)); err != nil {
			t.Error(err)
		}
	})
	// The first candidate's subnet is taken by a route of the host's: Up
	// goes on to the next.
	first := Candidate(name, id, mac, proxyAddr, 0)
	dummy := "avt-b-" + id[:6]
	run(t, ipProg, "link", "add", dummy, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command(ipProg, "link", "del", dummy).Run() })
	run(t, ipProg, "addr", "add", first.Subnet.Addr().Next().Next().Next().String()+"/29", "dev", dummy)
	run(t, ipProg, "link", "set", dummy, "up")

	n, err := l.Up(ctx, name, func(i int) Net { return Candidate(name, id, mac, proxyAddr, i) })
	if err != nil {
		t.Fatal(err)
	}
	if n.Subnet == first.Subnet || n != Candidate(name, id, mac, proxyAddr, 1) {
		t.Fatalf("Up took %s, want the second candidate (the first is the other bridge's)", n.Subnet)
	}
	again, err := l.Up(ctx, name, func(i int) Net { return Candidate(name, id, mac, proxyAddr, i) })
	if err != nil || again != n {
		t.Fatalf("Up of the running network: %+v, %v; want it found as it is", again, err)
	}
	conf, err := os.ReadFile("/var/lib/libvirt/dnsmasq/" + name + ".conf")
	if err != nil || !strings.Contains(string(conf), "dhcp-option=121,10.0.2.100/32,"+n.Host.String()) || !strings.Contains(string(conf), "port=0") {
		t.Errorf("dnsmasq's configuration lacks the route or has DNS on: %v\n%s", err, conf)
	}

	say := func(addr, word string) int {
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprint(c, word)
				c.Close()
			}
		}()
		return ln.Addr().(*net.TCPAddr).Port
	}
	proxy, exposed, wide := say(n.Host.String(), "proxy"), say(n.Host.String(), "exposed"), say("0.0.0.0", "wide")
	rs, err := n.Ruleset(id, Front{ProxyPort: 3128, Proxy: proxy, Exposed: map[int]int{8080: exposed}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Fence(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if err := l.Fence(ctx, rs); err != nil { // a second start rewrites it
		t.Fatalf("rewriting the fence: %v", err)
	}

	guest := "avt-g-" + id[:6]
	veth := "avt-v-" + id[:6]
	run(t, ipProg, "netns", "add", guest)
	t.Cleanup(func() { _ = exec.Command(ipProg, "netns", "del", guest).Run() })
	run(t, ipProg, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", guest)
	t.Cleanup(func() { _ = exec.Command(ipProg, "link", "del", veth).Run() })
	run(t, ipProg, "link", "set", veth, "master", n.Bridge, "up")
	run(t, ipProg, "-n", guest, "link", "set", "eth0", "address", mac, "up")
	run(t, ipProg, "-n", guest, "link", "set", "lo", "up")
	run(t, ipProg, "-n", guest, "addr", "add", n.Guest.String()+"/29", "dev", "eth0")
	run(t, ipProg, "-n", guest, "route", "add", "10.0.2.100/32", "via", n.Host.String())
	// DHCP hands out no default route; a guest's root adds one all the
	// same, to try the host's other addresses.
	run(t, ipProg, "-n", guest, "route", "add", "default", "via", n.Host.String())

	dial := func(addr string, port int) (string, error) {
		out, err := exec.Command(ipProg, "netns", "exec", guest, "timeout", "3", "bash", "-c",
			fmt.Sprintf("exec 3<>/dev/tcp/%s/%d && cat <&3", addr, port)).CombinedOutput()
		return string(out), err
	}
	if got, err := dial("10.0.2.100", 3128); err != nil || got != "proxy" {
		t.Errorf("the guest at the proxy address's proxy port: %q, %v; want the proxy's listener", got, err)
	}
	if got, err := dial("10.0.2.100", 8080); err != nil || got != "exposed" {
		t.Errorf("the guest at an exposed port: %q, %v; want its listener", got, err)
	}
	if got, err := dial("10.0.2.100", 8081); err == nil || !strings.Contains(got, "refused") {
		t.Errorf("the guest at a port neither the proxy's nor exposed: %q, %v; want a reset at once", got, err)
	}
	hostAddrs := []string{n.Host.String()}
	as, _ := net.InterfaceAddrs()
	for _, a := range as {
		if p, ok := a.(*net.IPNet); ok && p.IP.To4() != nil && !p.IP.IsLoopback() {
			hostAddrs = append(hostAddrs, p.IP.String())
		}
	}
	// What must not answer, tried at once (a dropped packet costs the
	// dial's whole timeout).
	var wg sync.WaitGroup
	refused := func(addr string, port int, what string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, err := dial(addr, port); err == nil {
				t.Errorf("the guest reached %s at %s:%d: %q", what, addr, port, got)
			}
		}()
	}
	for _, a := range hostAddrs {
		refused(a, wide, "the host's wildcard server")
	}
	for _, p := range []int{proxy, exposed} {
		refused(n.Host.String(), p, "the front directly")
	}
	wg.Wait()
	// The front is the guest's alone: not the host's other users'.
	for _, p := range []int{proxy, exposed} {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(n.Host.String(), strconv.Itoa(p)), 2*time.Second); err == nil {
			c.Close()
			t.Errorf("a process of the host reached the front at %s:%d", n.Host, p)
		}
	}
	// The host opens connections to the guest (vagrant's SSH).
	gl, err := testutil.ListenInNetns(guest, "0.0.0.0:2222")
	if err != nil {
		t.Fatal(err)
	}
	defer gl[0].Close()
	go func() {
		if c, err := gl[0].Accept(); err == nil {
			io.WriteString(c, "guest")
			c.Close()
		}
	}()
	var got string
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(n.Guest.String(), "2222"), 5*time.Second); err == nil {
		b, _ := io.ReadAll(c)
		got = string(b)
		c.Close()
	}
	if got != "guest" {
		t.Errorf("the host could not reach the guest: %q", got)
	}

	if err := l.Down(ctx, name, TableName(id)); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command(nft, "list", "table", "inet", TableName(id)).Run(); err == nil {
		t.Error("the fence outlived Down")
	}
	if _, err := l.virsh(ctx, "", "net-info", name); err == nil {
		t.Error("the network outlived Down")
	}
	if _, err := net.InterfaceByName(n.Bridge); err == nil {
		t.Error("the bridge outlived Down")
	}
	if err := l.Down(ctx, name, TableName(id)); err != nil {
		t.Errorf("Down of nothing: %v", err)
	}
}

func randomID(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func run(t *testing.T, prog string, args ...string) {
	t.Helper()
	if out, err := exec.Command(prog, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
}

// The network and its fence made over agent-vm's link (hostlink.Runner:
// virsh and nft run on the host through SSH), as for a remote host; here
// the host is this machine's sshd, so the bridge and table are checked
// locally, and Down over the link leaves nothing.
func TestNetworkOverTheLink(t *testing.T) {
	testutil.Need(t, os.Geteuid() == 0, "a libvirt network and an nftables table need root")
	nft := testutil.Program(t, NFT)
	testutil.Program(t, Virsh)
	libvirtd.ForTest(t)
	_, c := hostlinktest.Dial(t)
	l := Libvirt{Run: hostlink.Runner{C: c}, URI: libvirtd.URI}
	id := randomID(t)
	name := "agent-vm-test-" + id
	mac := "52:54:00:" + id[0:2] + ":" + id[2:4] + ":" + id[4:6]
	ctx := context.Background()
	t.Cleanup(func() { _ = l.Down(context.Background(), name, TableName(id)) })
	n, err := l.Up(ctx, name, func(i int) Net { return Candidate(name, id, mac, proxyAddr, i) })
	if err != nil {
		t.Fatal(err)
	}
	rs, err := n.Ruleset(id, Front{ProxyPort: 3128, Proxy: 40001})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Fence(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(n.Bridge); err != nil {
		t.Errorf("no bridge %s after Up over the link: %v", n.Bridge, err)
	}
	if out, err := exec.Command(nft, "list", "table", "inet", TableName(id)).CombinedOutput(); err != nil || !strings.Contains(string(out), "dnat ip to "+n.Host.String()+":40001") {
		t.Errorf("the fence made over the link: %v\n%s", err, out)
	}
	if err := l.Down(ctx, name, TableName(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(n.Bridge); err == nil {
		t.Error("the bridge outlived Down over the link")
	}
	if err := exec.Command(nft, "list", "table", "inet", TableName(id)).Run(); err == nil {
		t.Error("the fence outlived Down over the link")
	}
}
