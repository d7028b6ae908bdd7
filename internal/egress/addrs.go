package egress

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// The addresses the proxy never connects to, unless the user allowed that
// address itself: the host's own (every address on its interfaces, read
// at each dial, since they change), and the blocks below, which are not
// globally reachable: an address in them is the host, its networks, or
// somebody else's private network, never a public destination.

// A specialBlock is an entry of IANA's special-purpose address registries.
type specialBlock struct {
	prefix netip.Prefix
	name   string
}

func block(prefix, name string) specialBlock {
	return specialBlock{netip.MustParsePrefix(prefix), name}
}

// specialBlocks are the blocks that IANA's IPv4 and IPv6 Special-Purpose
// Address Registries (iana.org/assignments/iana-ipv4-special-registry and
// iana-ipv6-special-registry, as of 2025) do not mark globally reachable,
// plus multicast (IANA's IPv4 and IPv6 multicast address space
// registries) and IPv6's deprecated site-local block (RFC 3879). The
// names are the registries', shortened. Where blocks nest, the most
// specific names the refusal.
//
// The registries mark a few small blocks inside these globally reachable:
// 192.0.0.9/32 and 192.0.0.10/32 (PCP and TURN anycast), 2001:1::1-3/128
// (PCP, TURN and DNS-SD anycast), 2001:3::/32 (AMT), 2001:4:112::/48
// (AS112-v6), 2001:20::/28 (ORCHIDv2) and 2001:30::/28 (drone remote ID
// tags). They are refused all the same: an anycast service answers from
// whoever is nearest, often the user's own router or ISP (PCP's is the
// home router), and the ORCHID and drone blocks are identifiers, not
// places to connect to. No agent needs them through an HTTP proxy; a user
// who does allows the address itself.
//
// Outside these, an IPv6 address that is not in 2000::/3, the only space
// IANA allocates global unicast from, is refused too (the deprecated
// IPv4-compatible ::a.b.c.d, unassigned space): nothing public lives
// there, and the registries may add blocks the table does not know yet.
//
// Blocks that carry an IPv4 address are judged by that address instead
// (embeddedIPv4): IPv4-mapped (::ffff:0:0/96), NAT64's well-known prefix
// (64:ff9b::/96, which the registry marks globally reachable) and 6to4
// (2002::/16, which it marks N/A).
var specialBlocks = []specialBlock{
	block("0.0.0.0/8", `"this network"`),
	block("10.0.0.0/8", "private-use"),
	block("100.64.0.0/10", "shared address space, CGNAT"),
	block("127.0.0.0/8", "loopback"),
	block("169.254.0.0/16", "link-local"),
	block("172.16.0.0/12", "private-use"),
	block("192.0.0.0/24", "IETF protocol assignments"),
	block("192.0.2.0/24", "documentation, TEST-NET-1"),
	block("192.88.99.0/24", "deprecated 6to4 relay anycast"),
	block("192.168.0.0/16", "private-use"),
	block("198.18.0.0/15", "benchmarking"),
	block("198.51.100.0/24", "documentation, TEST-NET-2"),
	block("203.0.113.0/24", "documentation, TEST-NET-3"),
	block("224.0.0.0/4", "multicast"),
	block("240.0.0.0/4", "reserved"),
	block("255.255.255.255/32", "limited broadcast"),

	block("::/128", "unspecified address"),
	block("::1/128", "loopback address"),
	block("64:ff9b:1::/48", "local-use IPv4-IPv6 translation"),
	block("100::/64", "discard-only address block"),
	block("100:0:0:1::/64", "dummy IPv6 prefix"),
	block("2001::/23", "IETF protocol assignments"),
	// Teredo carries IPv4 addresses too, but the client's is obfuscated
	// and the registry marks the block N/A: refused whole.
	block("2001::/32", "Teredo"),
	block("2001:2::/48", "benchmarking"),
	block("2001:10::/28", "deprecated ORCHID"),
	block("2001:db8::/32", "documentation"),
	block("3fff::/20", "documentation"),
	block("5f00::/16", "segment routing (SRv6) SIDs"),
	block("fc00::/7", "unique-local"),
	block("fe80::/10", "link-local unicast"),
	block("fec0::/10", "deprecated site-local"),
	block("ff00::/8", "multicast"),
}

// globalUnicast6 is IPv6's global unicast space (RFC 4291, IANA's IPv6
// address space registry).
var globalUnicast6 = netip.MustParsePrefix("2000::/3")

// embeddings are the IPv6 blocks that carry an IPv4 address, and where.
var embeddings = []struct {
	prefix netip.Prefix
	name   string
	at     int // the IPv4 address's first byte
}{
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64", 12},
	{netip.MustParsePrefix("2002::/16"), "6to4", 2},
}

// special is the most specific block that holds a.
func special(a netip.Addr) (specialBlock, bool) {
	var found specialBlock
	for _, b := range specialBlocks {
		if b.prefix.Contains(a) && (!found.prefix.IsValid() || b.prefix.Bits() > found.prefix.Bits()) {
			found = b
		}
	}
	return found, found.prefix.IsValid()
}

// embeddedIPv4 is the IPv4 address an IPv6 address of an embedding block
// carries, and that block's name.
func embeddedIPv4(a netip.Addr) (netip.Addr, string, bool) {
	for _, e := range embeddings {
		if e.prefix.Contains(a) {
			b := a.As16()
			return netip.AddrFrom4([4]byte(b[e.at : e.at+4])), e.name, true
		}
	}
	return netip.Addr{}, "", false
}

// Refusal is an address the proxy does not connect to, and why.
type Refusal struct {
	Addr netip.Addr `json:"addr"`
	// Why says why in plain words: "an address of this host", "in
	// 10.0.0.0/8 (private-use), which is not globally reachable".
	Why string `json:"why"`
	// Own: Addr is one of the host's own addresses (or carries one): no
	// pin lets it through, only the address itself on the allow-list.
	Own bool `json:"own,omitempty"`
}

// Judge says why the proxy refuses to connect to a, given the host's own
// addresses; refused is false when it connects (a globally reachable
// address of another machine). A pin or the address on the allow-list
// may still let a refused address through (reachable). The refusal's
// Addr is a as an IPv4 address when a is one in IPv6's mapped form (which
// resolvers give for /etc/hosts' entries).
func Judge(a netip.Addr, own []netip.Addr) (r Refusal, refused bool) {
	why, isOwn := refusal(a, own)
	return Refusal{Addr: a.Unmap().WithZone(""), Why: why, Own: isOwn}, why != ""
}

// refusal says why the proxy must not connect to a, given the host's own
// addresses, or "" when it may; isOwn when a is (or carries) one of them.
// The host's own addresses come first, so that reason wins when both
// apply.
func refusal(a netip.Addr, own []netip.Addr) (why string, isOwn bool) {
	a = a.Unmap().WithZone("")
	if slices.ContainsFunc(own, func(o netip.Addr) bool { return o.Unmap().WithZone("") == a }) {
		return "an address of this host", true
	}
	if v4, name, ok := embeddedIPv4(a); ok {
		if why, isOwn := refusal(v4, own); why != "" {
			return fmt.Sprintf("the %s form of %s, %s", name, v4, why), isOwn
		}
		return "", false
	}
	if b, ok := special(a); ok {
		return fmt.Sprintf("in %s (%s), which is not globally reachable", b.prefix, b.name), false
	}
	if a.Is6() && !globalUnicast6.Contains(a) {
		return fmt.Sprintf("outside %s, IPv6's global unicast space", globalUnicast6), false
	}
	return "", false
}

// HostAddrs lists the addresses on the host's interfaces, which the proxy
// never connects to (Judge's own).
func HostAddrs() ([]netip.Addr, error) {
	own, err := interfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing this host's addresses: %w", err)
	}
	return own, nil
}

// interfaceAddrs lists the addresses on the host's interfaces (no
// privilege needed: the proxy calls it after dropping to a normal user).
func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
