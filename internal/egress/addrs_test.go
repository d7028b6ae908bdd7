package egress

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// get asks the fixture's proxy for u.
func (f *fixture) get(u string) (int, string) {
	f.t.Helper()
	resp, err := f.client().Get(u)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// wantRefused checks that the proxy refuses to connect to name, which
// resolves to addr, for the reason why: a 403 saying so, and a log entry
// with the address and the reason. It asks the proxy only once refusal
// agrees, so that a wrong judgement never makes a test connect outside
// this machine.
func (f *fixture) wantRefused(name, addr string, own []netip.Addr, why string) {
	f.t.Helper()
	a := netip.MustParseAddr(addr)
	if got, _ := refusal(a, own); got != why {
		f.t.Errorf("%s: refusal = %q, want %q", addr, got, why)
		return
	}
	f.resolveTo(name, a)
	code, body := f.get("http://" + name + "/")
	want := fmt.Sprintf("%s resolves to %s, %s", name, a.Unmap(), why)
	if code != http.StatusForbidden || !strings.Contains(body, want) {
		f.t.Errorf("%s: %d %q; want 403 saying %q", addr, code, body, want)
	}
	es, err := ReadLog(filepath.Join(f.dir, LogFile))
	if err != nil || len(es) == 0 {
		f.t.Fatalf("the log: %v %v", es, err)
	}
	if e := es[len(es)-1]; e.Allowed || e.Rule != RuleAddresses || len(e.Refused) != 1 || e.Refused[0].Addr != a.Unmap() || e.Refused[0].Why != why {
		f.t.Errorf("%s: logged %+v, want it refused for %q", addr, e, why)
	}
}

func notGlobal(prefix, name string) string {
	return fmt.Sprintf("in %s (%s), which is not globally reachable", prefix, name)
}

// Every block that is not globally reachable is refused, in every mode:
// mode open allows any name, and still reaches none of these.
func TestRefusesWhatIsNotGloballyReachable(t *testing.T) {
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeOpen})
	f.pretendOwn() // none: each address is judged by its block alone
	private10 := notGlobal("10.0.0.0/8", "private-use")
	for _, c := range []struct{ addr, why string }{
		{"0.0.0.0", notGlobal("0.0.0.0/8", `"this network"`)},
		{"0.1.2.3", notGlobal("0.0.0.0/8", `"this network"`)},
		{"10.1.2.3", private10},
		{"100.64.0.1", notGlobal("100.64.0.0/10", "shared address space, CGNAT")},
		{"100.127.255.254", notGlobal("100.64.0.0/10", "shared address space, CGNAT")},
		{"127.0.0.1", notGlobal("127.0.0.0/8", "loopback")},
		{"127.255.0.9", notGlobal("127.0.0.0/8", "loopback")},
		{"169.254.169.254", notGlobal("169.254.0.0/16", "link-local")},
		{"172.16.0.1", notGlobal("172.16.0.0/12", "private-use")},
		{"172.31.255.254", notGlobal("172.16.0.0/12", "private-use")},
		{"192.0.0.8", notGlobal("192.0.0.0/24", "IETF protocol assignments")},
		{"192.0.0.9", notGlobal("192.0.0.0/24", "IETF protocol assignments")}, // PCP anycast: refused on purpose
		{"192.0.2.1", notGlobal("192.0.2.0/24", "documentation, TEST-NET-1")},
		{"192.88.99.1", notGlobal("192.88.99.0/24", "deprecated 6to4 relay anycast")},
		{"192.168.1.1", notGlobal("192.168.0.0/16", "private-use")},
		{"198.18.0.1", notGlobal("198.18.0.0/15", "benchmarking")},
		{"198.19.255.254", notGlobal("198.18.0.0/15", "benchmarking")},
		{"198.51.100.1", notGlobal("198.51.100.0/24", "documentation, TEST-NET-2")},
		{"203.0.113.1", notGlobal("203.0.113.0/24", "documentation, TEST-NET-3")},
		{"224.0.0.1", notGlobal("224.0.0.0/4", "multicast")},
		{"239.255.255.250", notGlobal("224.0.0.0/4", "multicast")},
		{"240.0.0.1", notGlobal("240.0.0.0/4", "reserved")},
		{"255.255.255.255", notGlobal("255.255.255.255/32", "limited broadcast")},

		{"::", notGlobal("::/128", "unspecified address")},
		{"::1", notGlobal("::1/128", "loopback address")},
		{"::ffff:10.1.2.3", private10},
		{"64:ff9b::a01:203", "the NAT64 form of 10.1.2.3, " + private10},
		{"64:ff9b:1::1", notGlobal("64:ff9b:1::/48", "local-use IPv4-IPv6 translation")},
		{"100::1", notGlobal("100::/64", "discard-only address block")},
		{"100:0:0:1::1", notGlobal("100:0:0:1::/64", "dummy IPv6 prefix")},
		{"2001::1", notGlobal("2001::/32", "Teredo")},
		{"2001:1::1", notGlobal("2001::/23", "IETF protocol assignments")}, // PCP anycast: refused on purpose
		{"2001:2::1", notGlobal("2001:2::/48", "benchmarking")},
		{"2001:10::1", notGlobal("2001:10::/28", "deprecated ORCHID")},
		{"2001:1ff::1", notGlobal("2001::/23", "IETF protocol assignments")},
		{"2001:db8::1", notGlobal("2001:db8::/32", "documentation")},
		{"2002:a01:203::1", "the 6to4 form of 10.1.2.3, " + private10},
		{"3fff::1", notGlobal("3fff::/20", "documentation")},
		{"5f00::1", notGlobal("5f00::/16", "segment routing (SRv6) SIDs")},
		{"fc00::1", notGlobal("fc00::/7", "unique-local")},
		{"fd12:3456::1", notGlobal("fc00::/7", "unique-local")},
		{"fe80::1", notGlobal("fe80::/10", "link-local unicast")},
		{"fec0::1", notGlobal("fec0::/10", "deprecated site-local")},
		{"ff02::1", notGlobal("ff00::/8", "multicast")},
		{"::a01:203", "outside 2000::/3, IPv6's global unicast space"}, // IPv4-compatible (deprecated)
		{"4000::1", "outside 2000::/3, IPv6's global unicast space"},   // unassigned
		{"fe00::1", "outside 2000::/3, IPv6's global unicast space"},   // unassigned, between ULA and link-local
	} {
		f.wantRefused("target.test", c.addr, nil, c.why)
	}
}

// A public address passes, and so do the IPv4-mapped, NAT64 and 6to4
// forms of a public IPv4 address, and the neighbours of refused blocks.
// Only the decision is checked: nothing here connects outside this
// machine.
func TestAPublicAddressPasses(t *testing.T) {
	pol := Policy{Branch: "feat", Mode: ModeOpen}
	f := newFixture(t, pol)
	f.pretendOwn(netip.MustParseAddr("8.8.4.4"))
	for _, s := range []string{"1.1.1.1", "2606:4700:4700::1111", "::ffff:1.1.1.1", "64:ff9b::101:101", "2002:101:101::1",
		"100.128.0.1", "172.32.0.1", "198.20.0.1", "192.0.3.1", "2001:200::1", "2003::1"} {
		a := netip.MustParseAddr(s)
		f.resolveTo("public.test", a)
		got, refused, err := f.p.reachable(context.Background(), "public.test", pol)
		if err != nil || len(refused) != 0 || !slices.Equal(got, []netip.Addr{a}) {
			t.Errorf("%s: reachable = %v, refused %v, %v; want it kept", s, got, refused, err)
		}
	}
}

// The host's own addresses are refused whatever they look like, and that
// reason wins over a block's.
func TestRefusesTheHostsOwnAddresses(t *testing.T) {
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"own.test"}})
	own := []netip.Addr{netip.MustParseAddr("8.8.4.4"), netip.MustParseAddr("2001:4860:4860::8844"), netip.MustParseAddr("10.9.8.7")}
	f.pretendOwn(own...)
	for _, c := range []struct{ addr, why string }{
		{"8.8.4.4", "an address of this host"},
		{"2001:4860:4860::8844", "an address of this host"},
		{"10.9.8.7", "an address of this host"},
		{"::ffff:8.8.4.4", "an address of this host"},
		{"64:ff9b::808:404", "the NAT64 form of 8.8.4.4, an address of this host"},
		{"2002:808:404::1", "the 6to4 form of 8.8.4.4, an address of this host"},
	} {
		f.wantRefused("own.test", c.addr, own, c.why)
	}
	// An IP literal in mode open alike.
	f.setPolicy(Policy{Branch: "feat", Mode: ModeOpen})
	if code, body := f.get("http://8.8.4.4/"); code != http.StatusForbidden || !strings.Contains(body, "8.8.4.4 resolves to 8.8.4.4, an address of this host") {
		t.Errorf("the host's own address as an IP literal in mode open: %d %q", code, body)
	}
}

// The host's addresses change (a VPN comes up, DHCP renews): the proxy
// lists them at each dial.
func TestHostAddressesAreReadAtEachDial(t *testing.T) {
	pol := Policy{Branch: "feat", Mode: ModeOpen}
	f := newFixture(t, pol)
	before, after := netip.MustParseAddr("8.8.4.4"), netip.MustParseAddr("9.9.9.9")
	f.pretendOwn(before)
	f.wantRefused("moved.test", "8.8.4.4", []netip.Addr{before}, "an address of this host")
	f.pretendOwn(after)
	f.wantRefused("moved.test", "9.9.9.9", []netip.Addr{after}, "an address of this host")
	// The old address is no longer the host's (only the decision: nothing
	// here connects outside this machine).
	f.resolveTo("moved.test", before)
	if got, refused, err := f.p.reachable(context.Background(), "moved.test", pol); err != nil || len(refused) != 0 || !slices.Equal(got, []netip.Addr{before}) {
		t.Errorf("the host's former address: reachable = %v, refused %v, %v; want it kept", got, refused, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ownReads != 3 {
		t.Errorf("the host's addresses were listed %d times for 3 dials", f.ownReads)
	}
}

// An address on the allow-list itself is reached, whatever the reason it
// would be refused for.
func TestAnAllowedAddressIsReachedWhateverItsKind(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "local") }))
	defer srv.Close()
	p := port(t, srv.URL)
	for _, c := range []struct {
		kind, addr string
		own        []netip.Addr
		why        string
	}{
		{"special-purpose", "127.0.0.1", nil, notGlobal("127.0.0.0/8", "loopback")},
		{"the host's own", "127.0.0.1", []netip.Addr{loopback}, "an address of this host"},
		{"IPv4-mapped", "::ffff:127.0.0.1", nil, notGlobal("127.0.0.0/8", "loopback")},
	} {
		f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"target.test"}})
		f.pretendOwn(c.own...)
		f.wantRefused("target.test", c.addr, c.own, c.why)
		f.setPolicy(Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"target.test", "127.0.0.1"}})
		if code, body := f.get("http://target.test:" + p + "/"); code != http.StatusOK || body != "local" {
			t.Errorf("%s, allowed: %d %q; want the server's answer", c.kind, code, body)
		}
	}
}

// Without a lister, the proxy reads the host's interfaces, where the
// loopback's address is.
func TestTheRealListerHasTheLoopback(t *testing.T) {
	own, err := interfaceAddrs()
	if err != nil || !slices.Contains(own, loopback) {
		t.Fatalf("interfaceAddrs = %v, %v; want 127.0.0.1 among them", own, err)
	}
}
