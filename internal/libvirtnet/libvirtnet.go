// Package libvirtnet contains the network of a VM that libvirt runs: one
// isolated libvirt network per VM, and one nftables table of agent-vm's
// that fences it, and the containment of a machine that puts the two
// together with its egress proxy (Containment, contain.go). It is for the
// drivers whose machines libvirt runs (the vagrant driver, and the libvirt
// driver's pieces in internal/libvirt); QEMU's own user network is
// contained by slirp instead (internal/qemu).
//
// # The network
//
// Each VM gets a libvirt network of its own (Net): no <forward> (libvirt's
// isolated mode: nothing is routed or NATed to the host's other networks),
// its own bridge (avm-<8 hex of the VM's uuid>), a /29 of its own out of
// Pool, DHCP with one reservation (the VM's MAC gets the .2, the bridge is
// the .1), DNS off (<dns enable='no'/>: dnsmasq answers no query and
// forwards none, so a name resolves nowhere in the guest, as under QEMU's
// restricted network), and one classless static route handed out by DHCP
// (option 121, through libvirt's dnsmasq:options): the proxy address
// (guest.HostAddr, the address the guest reaches its egress proxy and its
// exposed ports at on every backend) by way of the bridge. The guest's
// networkd installs that route, and nothing else: no default route, no
// DNS server. A network per VM rather than one shared: guests on one
// bridge reach each other, and a guest that forges another's address
// would reach that VM's proxy, with its policy and its secrets; a bridge
// is a thing the guest cannot choose.
//
// Why the route rather than a per-VM proxy address: the guest's contract
// (its proxy settings, NO_PROXY, the MCP servers rewritten to the host,
// `port expose`'s address) names guest.HostAddr on every backend, so the
// same seed serves the qemu and the vagrant backends alike.
//
// The subnet is chosen when the network is made, at each start: candidates
// from Pool in an order that starts at a hash of the VM's id, the first
// libvirt accepts (libvirt refuses a network whose subnet a route of the
// host already covers: "already in use by interface ..."). Nothing keeps
// it between starts: the guest learns its address by DHCP at every boot.
//
// # The fence
//
// An isolated libvirt network does not keep the guest from the host: the
// bridge's address is the host's, and Linux answers on any of its
// addresses whichever interface a packet came in on, so the guest would
// reach every service of the host's (and, for IPv6, its link-local
// addresses). The fence is one nftables table per VM, inet family
// (IPv4 and IPv6), agent_vm_<8 hex>, rewritten atomically (Ruleset):
//
//   - prerouting (nat): TCP from the bridge to the proxy address is led
//     to the egress proxy's TCP front on the bridge's address
//     (egress.Front): the proxy port to the proxy's listener, each exposed
//     port to its own listener; every port the kernel chose for the
//     proxy, so nothing already on the host's wildcard address is in the
//     way.
//   - prerouting (filter, after the nat): TCP from the bridge to the proxy
//     address on any other port gets a reset, so the guest learns
//     at once. Here, not in forward: a host that forwards no packets
//     (net.ipv4.ip_forward 0, as Debian leaves it when no libvirt network
//     with NAT runs) drops them before the forward hook, and the guest's
//     connection would hang instead.
//   - input (filter): the front's ports are the guest's alone: from
//     anywhere else (the host's own users on its loopback, a neighbour that
//     routes to the bridge) they are dropped, as the QEMU driver's proxy
//     socket is 0600. From the bridge, replies to connections the host
//     opened (vagrant's and agent-vm's SSH, the forwarders), DHCP, and the
//     front's ports by way of the proxy address are let in; everything else the
//     guest sends to the host is dropped, whatever the address.
//   - forward (filter): nothing from or to the bridge is forwarded.
//
// A drop in any table's base chain is final in nftables, so libvirt's own
// rules (iptables, other tables) cannot open what the fence drops.
// Creating the bridge and the table needs root (CAP_NET_ADMIN): as another
// user a driver refuses to start a contained machine, in its own words,
// before it calls Contain.
//
// # The containment
//
// Containment.Contain makes a machine's contained network before the
// machine starts: a marker in its run directory (ContainedMark) that a
// start made one, the libvirt network (Libvirt.Up, named as the driver
// says: the vagrant driver names it after its machine), the egress proxy
// (the Machine.Network's program, `agent-vm net-proxy`) with its TCP front
// on the bridge's address and one listener per exposed port, its
// ports file (FrontPorts) in the run directory and its output (EgressLog)
// in the logs directory, and the fence to the ports the proxy chose. As
// root the proxy drops to the workspace's owner once it listens, as the
// QEMU driver's does (egress.GiveDir gives it the network directory
// first). Containment.Uncontain ends the proxy and removes the fence and
// the network after a stop, a destroy or a failed start: best effort,
// logged, since none of those may fail for it; while the marker stays the
// next start or destroy tries again.
package libvirtnet

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// Pool is where VMs' subnets are taken from, a /29 each (8192 of them).
var Pool = netip.MustParsePrefix("10.213.0.0/16")

// subnetBits is the size of a VM's subnet: a /29 holds the bridge, the
// guest and four spare addresses DHCP may hand out to a guest that asks
// with another MAC.
const subnetBits = 29

// Programs this package runs.
const (
	Virsh = "virsh"
	NFT   = "nft"
)

// Net is one VM's isolated network.
type Net struct {
	// Name is the libvirt network's name (the machine's).
	Name string
	// Bridge is its bridge device, at most 15 bytes.
	Bridge string
	// Subnet is its /29; Host (the bridge) is its first address and Guest
	// (the reservation for MAC) its second.
	Subnet      netip.Prefix
	Host, Guest netip.Addr
	// MAC is the guest's NIC.
	MAC string
	// ProxyAddr is the address the guest reaches its proxy and exposed ports at
	// (guest.HostAddr), routed to Host by DHCP.
	ProxyAddr netip.Addr
}

// ID is the 8 hex digits of a VM's uuid that name its bridge and table.
func ID(uuid string) string {
	hex := strings.ReplaceAll(uuid, "-", "")
	return hex[:min(8, len(hex))]
}

// BridgeName is the bridge of the VM whose uuid id names (ID).
func BridgeName(id string) string { return "avm-" + id }

// TableName is the nftables table (inet family) of that VM's fence.
func TableName(id string) string { return "agent_vm_" + id }

// Candidate is the i-th subnet of Pool tried for the VM with id (an order
// that starts at a hash of it, so two VMs rarely try the same first), as
// a Net.
func Candidate(name, id, mac string, proxyAddr netip.Addr, i int) Net {
	h := sha256.Sum256([]byte(id))
	n := 1 << (subnetBits - Pool.Bits())
	k := (int(binary.BigEndian.Uint32(h[:4])) + i) % n
	base := Pool.Addr().As4()
	off := binary.BigEndian.Uint32(base[:]) + uint32(k)<<(32-subnetBits)
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], off)
	sub := netip.PrefixFrom(netip.AddrFrom4(a), subnetBits)
	host := sub.Addr().Next()
	return Net{Name: name, Bridge: BridgeName(id), Subnet: sub, Host: host, Guest: host.Next(), MAC: mac, ProxyAddr: proxyAddr}
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	bridgeRE = regexp.MustCompile(`^[a-z0-9-]{1,15}$`)
	macRE    = regexp.MustCompile(`^([0-9a-f]{2}:){5}[0-9a-f]{2}$`)
)

func (n Net) validate() error {
	switch {
	case !nameRE.MatchString(n.Name):
		return fmt.Errorf("internal error: libvirt network name %q", n.Name)
	case !bridgeRE.MatchString(n.Bridge):
		return fmt.Errorf("internal error: bridge name %q", n.Bridge)
	case !macRE.MatchString(n.MAC):
		return fmt.Errorf("internal error: MAC %q", n.MAC)
	case !n.Subnet.IsValid() || !n.Subnet.Addr().Is4() || !n.Subnet.Contains(n.Host) || !n.Subnet.Contains(n.Guest) || !n.ProxyAddr.Is4():
		return fmt.Errorf("internal error: network %s, host %s, guest %s, proxy address %s", n.Subnet, n.Host, n.Guest, n.ProxyAddr)
	case n.Subnet.Contains(n.ProxyAddr):
		return fmt.Errorf("internal error: the proxy address %s is inside the VM's subnet %s", n.ProxyAddr, n.Subnet)
	}
	return nil
}

var netXML = template.Must(template.New("net").Parse(`<network xmlns:dnsmasq='http://libvirt.org/schemas/network/dnsmasq/1.0'>
  <name>{{.Name}}</name>
  <bridge name='{{.Bridge}}' stp='off' delay='0'/>
  <dns enable='no'/>
  <ip address='{{.Host}}' netmask='{{.Netmask}}'>
    <dhcp>
      <range start='{{.Guest}}' end='{{.Last}}'/>
      <host mac='{{.MAC}}' ip='{{.Guest}}'/>
    </dhcp>
  </ip>
  <dnsmasq:options>
    <dnsmasq:option value='dhcp-option=121,{{.ProxyAddr}}/32,{{.Host}}'/>
  </dnsmasq:options>
</network>
`))

// XML is n as a libvirt network definition (see the package doc).
func (n Net) XML() (string, error) {
	if err := n.validate(); err != nil {
		return "", err
	}
	bits := ^uint32(0) << (32 - n.Subnet.Bits())
	var mask, last [4]byte
	binary.BigEndian.PutUint32(mask[:], bits)
	base := n.Subnet.Addr().As4()
	// The last address DHCP hands out: the one below the broadcast.
	binary.BigEndian.PutUint32(last[:], binary.BigEndian.Uint32(base[:])|^bits-1)
	var b strings.Builder
	err := netXML.Execute(&b, struct {
		Net
		Netmask, Last netip.Addr
	}{n, netip.AddrFrom4(mask), netip.AddrFrom4(last)})
	return b.String(), err
}

// Front is where the fence leads the guest's connections to the proxy address:
// the egress proxy's TCP front on the bridge's address (egress.FrontPorts).
type Front struct {
	// ProxyPort is the proxy's port at the proxy address
	// (guest.ProxyPort), Proxy its listener's port on the bridge.
	ProxyPort, Proxy int
	// Exposed maps each exposed port (the same at the proxy address as on
	// the host's loopback) to its listener's port on the bridge.
	Exposed map[int]int
}

var rules = template.Must(template.New("nft").Parse(`add table inet {{.Table}}
delete table inet {{.Table}}
table inet {{.Table}} {
	comment "agent-vm: the guest on {{.Bridge}} reaches only its egress proxy and exposed ports at {{.ProxyAddr}}"
	chain front {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "{{.Bridge}}" ip daddr {{.ProxyAddr}} tcp dport {{.ProxyPort}} dnat ip to {{.Host}}:{{.Proxy}}
{{- range .Exposed}}
		iifname "{{$.Bridge}}" ip daddr {{$.ProxyAddr}} tcp dport {{.Port}} dnat ip to {{$.Host}}:{{.To}}
{{- end}}
	}
	chain refuse {
		type filter hook prerouting priority dstnat + 10; policy accept;
		iifname "{{.Bridge}}" ip daddr {{.ProxyAddr}} meta l4proto tcp reject with tcp reset
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname != "{{.Bridge}}" ip daddr {{.Host}} tcp dport { {{.Ports}} } drop
		iifname "{{.Bridge}}" ct state established,related accept
		iifname "{{.Bridge}}" meta nfproto ipv4 udp dport 67 accept
		iifname "{{.Bridge}}" ip daddr {{.Host}} tcp dport { {{.Ports}} } ct status dnat accept
		iifname "{{.Bridge}}" drop
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname "{{.Bridge}}" drop
		oifname "{{.Bridge}}" drop
	}
}
`))

type exposedPort struct{ Port, To int }

// Ruleset is the fence of n for front, as `nft -f` reads it: it replaces
// the VM's table whole, in one transaction.
func (n Net) Ruleset(id string, f Front) (string, error) {
	if err := n.validate(); err != nil {
		return "", err
	}
	ok := func(p int) bool { return p > 0 && p < 65536 }
	if !ok(f.ProxyPort) || !ok(f.Proxy) {
		return "", fmt.Errorf("internal error: proxy ports %d, %d", f.ProxyPort, f.Proxy)
	}
	ports := []string{fmt.Sprint(f.Proxy)}
	var exposed []exposedPort
	for p, to := range f.Exposed {
		if !ok(p) || !ok(to) || p == f.ProxyPort {
			return "", fmt.Errorf("internal error: exposed port %d at %d", p, to)
		}
		exposed = append(exposed, exposedPort{p, to})
		ports = append(ports, fmt.Sprint(to))
	}
	slices.SortFunc(exposed, func(a, b exposedPort) int { return a.Port - b.Port })
	slices.Sort(ports)
	var b strings.Builder
	err := rules.Execute(&b, struct {
		Net
		Table, Ports string
		ProxyPort    int
		Proxy        int
		Exposed      []exposedPort
	}{n, TableName(id), strings.Join(ports, ", "), f.ProxyPort, f.Proxy, exposed})
	return b.String(), err
}

// Libvirt runs virsh and nft for one libvirt connection.
type Libvirt struct {
	Run execx.Runner
	URI string
}

func (l Libvirt) virsh(ctx context.Context, stdin string, args ...string) (execx.Result, error) {
	c := execx.Cmd{Path: Virsh, Args: append([]string{"-c", l.URI}, args...), Env: []string{"LC_ALL=C"}}
	if stdin != "" {
		c.Stdin = strings.NewReader(stdin)
	}
	return l.Run.Run(ctx, c)
}

// inUse is libvirt's refusal of a subnet a route of the host covers.
func inUse(err error) bool {
	return err != nil && strings.Contains(err.Error(), "already in use")
}

// tries is how many subnets Up tries before it gives up.
const tries = 16

// Up makes the VM's network and starts it, or finds it running (a start
// after a crash or of a paused machine: the network is the machine's
// still), and returns it. candidate(i) is the i-th subnet to try. A
// network of that name that is defined but not running is made afresh (a
// start after a stop finds none: Down removed it). On failure nothing of
// it is left.
func (l Libvirt) Up(ctx context.Context, name string, candidate func(i int) Net) (Net, error) {
	if n, ok, err := l.running(ctx, name, candidate(0)); err != nil || ok {
		return n, err
	}
	if err := l.Down(ctx, name, ""); err != nil {
		return Net{}, err
	}
	var last error
	for i := range tries {
		n := candidate(i)
		x, err := n.XML()
		if err != nil {
			return Net{}, err
		}
		if _, err := l.virsh(ctx, x, "net-define", "/dev/stdin"); err != nil {
			return Net{}, fmt.Errorf("defining the VM's libvirt network %s: %w", name, err)
		}
		_, err = l.virsh(ctx, "", "net-start", name)
		if err == nil {
			return n, nil
		}
		_ = l.Down(context.WithoutCancel(ctx), name, "")
		if !inUse(err) {
			return Net{}, fmt.Errorf("starting the VM's libvirt network %s (%s): %w", name, n.Subnet, err)
		}
		last = err
	}
	return Net{}, fmt.Errorf("no free subnet for the VM's libvirt network %s: %d subnets of %s tried, the last refused with: %w (hint: routes of this host cover them; `ip route` shows which)", name, tries, Pool, last)
}

// running finds the network name running, and reads its subnet and
// reservation back from libvirt (want gives the rest: name, bridge, MAC,
// proxy address).
func (l Libvirt) running(ctx context.Context, name string, want Net) (Net, bool, error) {
	res, err := l.virsh(ctx, "", "net-info", name)
	if err != nil {
		return Net{}, false, nil // not defined
	}
	if !regexp.MustCompile(`(?m)^Active:\s+yes$`).Match(res.Stdout) {
		return Net{}, false, nil
	}
	res, err = l.virsh(ctx, "", "net-dumpxml", name)
	if err != nil {
		return Net{}, false, fmt.Errorf("reading the VM's libvirt network %s: %w", name, err)
	}
	m := regexp.MustCompile(`<ip address='([0-9.]+)' netmask='([0-9.]+)'`).FindSubmatch(res.Stdout)
	if m == nil {
		return Net{}, false, fmt.Errorf("the libvirt network %s runs but is not agent-vm's (no IPv4 address in its definition) (hint: `virsh net-destroy %s`, then start the VM again)", name, name)
	}
	host, err1 := netip.ParseAddr(string(m[1]))
	mask, err2 := netip.ParseAddr(string(m[2]))
	if err := errors.Join(err1, err2); err != nil {
		return Net{}, false, fmt.Errorf("reading the VM's libvirt network %s: %w", name, err)
	}
	m4 := mask.As4()
	bits := 0
	for v := binary.BigEndian.Uint32(m4[:]); v != 0; v <<= 1 {
		bits++
	}
	sub, err := host.Prefix(bits)
	if err != nil {
		return Net{}, false, err
	}
	n := want
	n.Subnet, n.Host, n.Guest = sub, host, host.Next()
	if !strings.Contains(string(res.Stdout), "<bridge name='"+want.Bridge+"'") || n.validate() != nil {
		return Net{}, false, fmt.Errorf("the libvirt network %s runs but is not this VM's (its bridge or addresses differ) (hint: `virsh net-destroy %s`, then start the VM again)", name, name)
	}
	return n, true, nil
}

// Down stops and removes the VM's network and, when table is not "", its
// fence; what is not there is nothing to do.
func (l Libvirt) Down(ctx context.Context, name, table string) error {
	var errs []error
	if table != "" {
		errs = append(errs, l.Unfence(ctx, table))
	}
	if _, err := l.virsh(ctx, "", "net-info", name); err == nil {
		if _, err := l.virsh(ctx, "", "net-destroy", name); err != nil && !strings.Contains(err.Error(), "not active") {
			errs = append(errs, fmt.Errorf("stopping the VM's libvirt network %s: %w", name, err))
		}
		if _, err := l.virsh(ctx, "", "net-undefine", name); err != nil {
			errs = append(errs, fmt.Errorf("removing the VM's libvirt network %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Fence writes the VM's table (Ruleset) in one nft transaction.
func (l Libvirt) Fence(ctx context.Context, ruleset string) error {
	if _, err := l.Run.Run(ctx, execx.Cmd{Path: NFT, Args: []string{"-f", "-"}, Stdin: strings.NewReader(ruleset)}); err != nil {
		return fmt.Errorf("fencing the VM's network with nftables: %w", err)
	}
	return nil
}

// Unfence removes the VM's table; none is nothing to do.
func (l Libvirt) Unfence(ctx context.Context, table string) error {
	// "add" then "delete" in one transaction: no error for a table that
	// was not there.
	rs := fmt.Sprintf("add table inet %s\ndelete table inet %s\n", table, table)
	if _, err := l.Run.Run(ctx, execx.Cmd{Path: NFT, Args: []string{"-f", "-"}, Stdin: strings.NewReader(rs)}); err != nil {
		return fmt.Errorf("removing the VM's nftables fence %s: %w", table, err)
	}
	return nil
}
