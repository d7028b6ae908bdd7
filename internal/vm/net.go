package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/state"
)

// NetDir is a VM's network directory, in the VM directory: the policy the
// proxy reads and its connection log (egress.PolicyFile, egress.LogFile),
// both 0600 and, with the directory, the user the proxy runs as.
const NetDir = "net"

// Egress modes, as create --net takes them.
const (
	NetOpen    = egress.ModeOpen
	NetAllow   = egress.ModeAllow
	NetOffline = egress.ModeOffline
)

// TestHostsEnv names test names the egress proxy resolves itself
// ("name=ip,..."): how tests lead an allowed name to a server on the
// host. Not for users. It overrides name resolution only: the proxy checks
// its answers as any name's, so a test that leads a name to the host's
// loopback also allows 127.0.0.1 itself.
const TestHostsEnv = "AGENT_VM_TEST_EGRESS_HOSTS"

func netDir(l state.Layout) string { return filepath.Join(l.Dir, NetDir) }

// NetLogPath is the VM's connection log.
func NetLogPath(l state.Layout) string { return filepath.Join(netDir(l), egress.LogFile) }

// netMode is the record's mode, allow by default.
func netMode(r *state.Record) string {
	if r.Net == nil || r.Net.Mode == "" {
		return NetAllow
	}
	return r.Net.Mode
}

// netPolicy is the proxy's policy for r: the default allow-list, the
// repository's git remote host, the user's own additions and refusals,
// and the exposed ports.
func netPolicy(r *state.Record) egress.Policy {
	p := egress.Policy{Branch: r.Slug, Mode: netMode(r), Allow: slices.Clone(egress.DefaultAllow)}
	for _, u := range []string{r.Git.UpstreamURL, r.Git.OriginURL} {
		if h := remoteHost(u); h != "" && !slices.Contains(p.Allow, h) {
			p.Allow = append(p.Allow, h)
		}
	}
	if r.Net != nil {
		for _, a := range r.Net.Allow {
			if !slices.Contains(p.Allow, a) {
				p.Allow = append(p.Allow, a)
			}
		}
		p.Deny = slices.Clone(r.Net.Deny)
	}
	for _, x := range r.Exposed {
		if !slices.Contains(p.Exposed, x.Port) {
			p.Exposed = append(p.Exposed, x.Port)
		}
	}
	slices.Sort(p.Exposed)
	return p
}

// remoteHost is the host of a git remote URL (https://host/..., ssh://,
// scp-like user@host:path); "" for local paths.
func remoteHost(u string) string {
	if u == "" || strings.HasPrefix(u, "/") || strings.HasPrefix(u, "file:") {
		return ""
	}
	if pu, err := url.Parse(u); err == nil && pu.Host != "" {
		h, err := egress.CheckPattern(pu.Hostname())
		if err != nil {
			return ""
		}
		return h
	}
	if at := strings.Index(u, "@"); at >= 0 {
		if host, _, ok := strings.Cut(u[at+1:], ":"); ok {
			if h, err := egress.CheckPattern(host); err == nil {
				return h
			}
		}
	}
	return ""
}

// writeNetPolicy renders r's policy for the proxy, which re-reads it at
// once.
func writeNetPolicy(l state.Layout, r *state.Record) error {
	if err := os.Mkdir(netDir(l), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return egress.WritePolicy(netDir(l), netPolicy(r))
}

// network is the contained network of a start: the proxy's policy written,
// the doors of the exposed ports, and this agent-vm binary as proxy and
// relay.
func (m *Manager) network(r *state.Record, l state.Layout) (*driver.Network, error) {
	if err := writeNetPolicy(l, r); err != nil {
		return nil, err
	}
	exe := m.Executable
	if exe == nil {
		exe = os.Executable
	}
	self, err := exe()
	if err != nil {
		return nil, fmt.Errorf("finding the agent-vm binary for the egress proxy: %w", err)
	}
	pol := netPolicy(r)
	return &driver.Network{Addr: guest.HostAddr, ProxyPort: guest.ProxyPort, Exposed: pol.Exposed, Dir: netDir(l),
		Proxy: []string{self, "net-proxy", "--dir", netDir(l)},
		Relay: []string{self, "net-relay"}}, nil
}

// NetInfo is `net show`: the VM's mode, its effective allow-list and
// refusals, and its doors.
type NetInfo struct {
	Branch  string          `json:"branch"`
	Mode    string          `json:"mode"`
	Allow   []string        `json:"allow"`
	Added   []string        `json:"added,omitempty"` // the user's own part of Allow
	Deny    []string        `json:"deny,omitempty"`
	Exposed []state.Exposed `json:"exposed,omitempty"`
	Proxy   string          `json:"proxy"` // as the guest reaches it
	Log     string          `json:"log"`
	// Uncontained says why nothing enforces the policy: the VM's driver
	// does not contain its network (the vagrant backend). Then Mode,
	// Allow, Deny and Exposed are what the record says, unused.
	Uncontained string `json:"uncontained,omitempty"`
}

// uncontained says why r's network is not contained, or "" when its
// driver contains it (a driver.NetworkContainer).
func (m *Manager) uncontained(r *state.Record) string {
	d, err := m.driverOf(r)
	if err != nil {
		return ""
	}
	if _, ok := d.(driver.NetworkContainer); ok {
		return ""
	}
	return fmt.Sprintf("NOT contained: the %s backend's guest is on its provider's network (vagrant-libvirt's NAT bridge) and reaches the host's bridge address and, through NAT, everything the host reaches; no allow-list applies and no connection is logged (hint: create the VM with --backend qemu for a contained network)", r.Backend)
}

// refuseUncontained refuses a change of a policy nothing would enforce.
func (m *Manager) refuseUncontained(r *state.Record, what string) error {
	if why := m.uncontained(r); why != "" {
		return fmt.Errorf("cannot %s for %q: its network is %s", what, r.Branch, why)
	}
	return nil
}

// NetShow reports a VM's egress policy.
func (m *Manager) NetShow(ctx context.Context, name string) (*NetInfo, error) {
	e, err := m.findRecorded(ctx, name)
	if err != nil {
		return nil, err
	}
	return m.netInfo(e), nil
}

func (m *Manager) netInfo(e state.Entry) *NetInfo {
	r := e.Record
	p := netPolicy(r)
	info := &NetInfo{Branch: r.Branch, Mode: p.Mode, Allow: p.Allow, Deny: p.Deny, Exposed: r.Exposed,
		Proxy: guest.ProxyURL, Log: NetLogPath(e.Layout)}
	if r.Net != nil {
		info.Added = r.Net.Allow
	}
	info.Uncontained = m.uncontained(r)
	return info
}

// NetChange is `net allow|deny|mode`: the patterns given, as the policy now
// has them.
type NetChange struct {
	Info *NetInfo
	// Live: the VM runs, and its proxy applies the change at once.
	Live bool
}

// NetAllow adds patterns to a VM's allow-list (and takes them off its
// refusals); NetDeny refuses them in every mode. Both apply at once to a
// running VM.
func (m *Manager) NetAllow(ctx context.Context, name string, patterns []string) (*NetChange, error) {
	return m.netEdit(ctx, name, patterns, func(n *state.Net, p string) {
		n.Deny = slices.DeleteFunc(n.Deny, func(d string) bool { return d == p })
		if !slices.Contains(n.Allow, p) && !slices.Contains(egress.DefaultAllow, p) {
			n.Allow = append(n.Allow, p)
		}
	})
}

// NetDeny: see NetAllow.
func (m *Manager) NetDeny(ctx context.Context, name string, patterns []string) (*NetChange, error) {
	return m.netEdit(ctx, name, patterns, func(n *state.Net, p string) {
		n.Allow = slices.DeleteFunc(n.Allow, func(a string) bool { return a == p })
		if !slices.Contains(n.Deny, p) {
			n.Deny = append(n.Deny, p)
		}
	})
}

// NetMode changes a VM's egress mode.
func (m *Manager) NetMode(ctx context.Context, name, mode string) (*NetChange, error) {
	if err := egress.CheckMode(mode); err != nil {
		return nil, err
	}
	return m.netUpdate(ctx, name, func(r *state.Record) { netOf(r).Mode = mode })
}

func netOf(r *state.Record) *state.Net {
	if r.Net == nil {
		r.Net = &state.Net{Mode: NetAllow}
	}
	return r.Net
}

func (m *Manager) netEdit(ctx context.Context, name string, patterns []string, edit func(*state.Net, string)) (*NetChange, error) {
	if len(patterns) == 0 {
		return nil, fmt.Errorf("no DOMAIN given (hint: e.g. example.com, *.example.com or 203.0.113.7)")
	}
	var clean []string
	for _, p := range patterns {
		c, err := egress.CheckPattern(p)
		if err != nil {
			return nil, err
		}
		clean = append(clean, c)
	}
	return m.netUpdate(ctx, name, func(r *state.Record) {
		for _, p := range clean {
			edit(netOf(r), p)
		}
	})
}

// netUpdate changes the record's network under the VM's lock and rewrites
// the proxy's policy.
func (m *Manager) netUpdate(ctx context.Context, name string, change func(*state.Record)) (*NetChange, error) {
	e, lock, err := m.lockedEntry(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	if err := m.refuseUncontained(e.Record, "change the network policy"); err != nil {
		return nil, err
	}
	change(e.Record)
	if err := state.WriteRecord(e.Layout.Record(), e.Record); err != nil {
		return nil, err
	}
	if err := writeNetPolicy(e.Layout, e.Record); err != nil {
		return nil, err
	}
	return &NetChange{Info: m.netInfo(e), Live: m.Status(ctx, e, false).State == StateRunning}, nil
}

// NetLog returns a VM's connection log, oldest first, and where it is.
func (m *Manager) NetLog(ctx context.Context, name string) ([]egress.Entry, string, error) {
	e, err := m.findRecorded(ctx, name)
	if err != nil {
		return nil, "", err
	}
	path := NetLogPath(e.Layout)
	es, err := egress.ReadLog(path)
	return es, path, err
}

// NetLogEntry is one connection of the log.
type NetLogEntry = egress.Entry

// FollowNetLog calls emit with each connection logged after the log's
// current end until ctx ends.
func FollowNetLog(ctx context.Context, path string, emit func(NetLogEntry) error) error {
	var off int64
	if fi, err := os.Stat(path); err == nil {
		off = fi.Size()
	}
	return egress.Follow(ctx, path, off, emit)
}

// EgressOptions are the hidden `net-proxy` command's flags.
type EgressOptions struct {
	Dir         string // the VM's network directory (policy, log)
	ProxySocket string
	DoorSocket  string
	QEMUPidFile string // exit once its process is gone
	RunAs       string // "UID:GID" to drop to before serving; "" keeps the caller's
	TestHosts   string // TestHostsEnv's value
	Log         hclog.Logger
}

// ServeEgress runs a VM's egress proxy (the hidden `net-proxy` command the
// driver starts) until ctx ends or the VM's QEMU is gone: it listens, waits
// for QEMU's pid, drops to o.RunAs, then serves (see internal/egress's
// doc on privileges).
func ServeEgress(ctx context.Context, o EgressOptions) error {
	p := &egress.Proxy{Logger: o.Log}
	hosts, runAs, pidFile := o.TestHosts, o.RunAs, o.QEMUPidFile
	if hosts != "" {
		p.Hosts = map[string]netip.Addr{}
		for _, kv := range strings.Split(hosts, ",") {
			name, addr, _ := strings.Cut(kv, "=")
			a, err := netip.ParseAddr(addr)
			if err != nil {
				return fmt.Errorf("%s: %q is not name=address", TestHostsEnv, kv)
			}
			p.Hosts[strings.ToLower(name)] = a
		}
	}
	var uid, gid int
	if runAs != "" {
		if _, err := fmt.Sscanf(runAs, "%d:%d", &uid, &gid); err != nil || uid <= 0 || gid < 0 {
			return fmt.Errorf("--run-as %q is not UID:GID of a user other than root", runAs)
		}
	}
	root, err := os.OpenRoot(o.Dir)
	if err != nil {
		return fmt.Errorf("the VM's network directory: %w", err)
	}
	defer root.Close()
	p.Dir, p.Log = root, &egress.Log{Dir: root, Name: egress.LogFile}
	ls, err := egress.Listen(o.ProxySocket, o.DoorSocket)
	if err != nil {
		return err
	}
	if pidFile != "" {
		pid, err := egress.WaitPid(ctx, pidFile, 2*time.Minute)
		if err != nil {
			return err
		}
		ctx = egress.Orphaned(ctx, pid)
	}
	if runAs != "" {
		if err := egress.DropPrivileges(uid, gid); err != nil {
			return err
		}
	}
	return p.Serve(ctx, ls)
}

// RelayEgress carries one guest connection (stdin and stdout, as QEMU's
// guestfwd hands it over) to the egress proxy's socket, or with door > 0
// to that exposed host port through the door socket (the hidden
// `net-relay` command).
func RelayEgress(ctx context.Context, sock string, door int, in io.Reader, out io.Writer) error {
	return egress.Relay(ctx, sock, door, in, out)
}
