// Package egress is a VM's only way out: a per-VM host-side
// proxy that the guest reaches through QEMU guestfwd rules, a policy that
// says which destinations it may reach, and a size-bounded log of every
// connection.
//
// The guest runs with slirp's restrict=on, so it reaches nothing of the host or
// beyond by itself: no gateway, no LAN, no DNS. Its ways out are guestfwd rules,
// each spawning `agent-vm net-relay` per connection, which carries the connection
// to one of this package's two unix sockets:
//   - the proxy socket: HTTP CONNECT (TLS passes through untouched; the decision
//     is made on the CONNECT host) and plain HTTP proxying (the decision is made
//     on the request's host). With an Interceptor, a CONNECT to a host a secret
//     is bound to is answered by the proxy itself, which puts the secret in
//     place of the guest's placeholder (intercept.go, with the VM's own CA:
//     ca.go) and judges each request by the policy's request rules (request.go):
//     GitHub's API may be read, but written to only as the rules list. The proxy
//     resolves names itself, only for destinations the policy allows, so the
//     guest needs no resolver, and connects to none of the host's own addresses
//     nor to one that is not globally reachable, unless the allow-list has that
//     address itself or, for the latter, a pin gives it to the very name asked
//     for (addrs.go, Pin). It answers such a refusal as any other, with a 403
//     that says why and what lifts it (Fix), which clients do not retry; a 502
//     means the destination could not be reached.
//   - the exposed-port socket: a host port the user exposed (`agent-vm port
//     expose`, `mcp sync`), named by the relay's preamble, which the guest
//     cannot write; a port no longer exposed is refused.
//
// A guest that libvirt runs (the vagrant backend's) has no slirp: it sits
// on a libvirt network of its own, and its ways out are the proxy's TCP front
// (front.go, `net-proxy --front`): the proxy and each exposed port listen
// on the bridge's address, on ports the kernel chooses, and the driver's
// nftables fence (internal/libvirtnet) leads the guest's connections to
// the proxy address there and lets nothing else of the host answer it.
// Behind either way in, the proxy is the same.
//
// The policy is a JSON file the orchestration writes (Policy) and the
// proxy re-reads when it changes, so `agent-vm net allow|deny` take effect
// at once.
//
// Privileges: the proxy parses what the guest sends, so it is never root.
// A root agent-vm starts it as root because it must make its sockets in
// root's directories and read QEMU's pid file in the VM's run directory;
// it then drops to the user QEMU runs as (the workspace's owner) before it
// serves a byte. From then on it reaches only what it opened before: its
// listening sockets, a pidfd of the QEMU, and the VM's network directory
// (policy and log, both the owner's) through an os.Root opened as root, so
// the owner needs no access to the state directory above it.
package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Modes of a VM's egress policy.
const (
	// ModeOpen allows every destination (still only through the proxy,
	// still logged; the host stays unreachable).
	ModeOpen = "open"
	// ModeAllow allows the allow-list only (the default).
	ModeAllow = "allow"
	// ModeOffline allows no destination; exposed host ports stay open.
	ModeOffline = "offline"
	// ModeAsk allows the allow-list and holds a connection to any other
	// destination while the user is asked (ask.go); unanswered, it is
	// refused after the policy's AskWait.
	ModeAsk = "ask"
)

// Modes lists the modes, for messages.
var Modes = []string{ModeOpen, ModeAllow, ModeAsk, ModeOffline}

// The groups of DefaultAllow. Each is agent-vm's own list; the ones a
// VM needs for its own software are PackageSources too.
var (
	// AgentHosts are the agents' APIs and their sign-in endpoints.
	AgentHosts = []string{
		"api.anthropic.com", "statsig.anthropic.com", "console.anthropic.com", "claude.ai",
		"api.openai.com", "auth.openai.com", "chatgpt.com",
		"generativelanguage.googleapis.com", "oauth2.googleapis.com", "accounts.google.com", "cloudcode-pa.googleapis.com",
	}
	// NPMRegistry is where the guest's npm installs from: the agents' CLIs
	// and chrome-devtools-mcp.
	NPMRegistry = "registry.npmjs.org"
	// Registries are the package registries agents use.
	Registries = []string{
		NPMRegistry, "registry.yarnpkg.com",
		"pypi.org", "files.pythonhosted.org",
		"proxy.golang.org", "sum.golang.org", "storage.googleapis.com",
		"crates.io", "index.crates.io", "static.crates.io",
		"rubygems.org", "repo.maven.apache.org",
	}
	// DebianMirrors are the hosts of the guest's apt sources (the base
	// image's: internal/image's DefaultMirror and DefaultSecurityMirror
	// are on deb.debian.org).
	DebianMirrors = []string{"deb.debian.org", "security.debian.org"}
	// SourceHosts are the git hosts' HTTPS endpoints agents fetch from.
	SourceHosts = []string{"github.com", "codeload.github.com", "objects.githubusercontent.com", "raw.githubusercontent.com"}
)

// DefaultAllow is the allow-list every VM starts with: the agents' APIs,
// the package registries agents use, Debian's mirrors and the common git
// hosts' HTTPS endpoints. The repository's own remote host is added per VM.
var DefaultAllow = slices.Concat(AgentHosts, Registries, DebianMirrors, SourceHosts)

// PackageSources are the names a VM needs for its own software and its
// agent, whatever the repository: Debian's mirrors (apt: first-boot
// packages, provisioning), npm's registry (the agents' CLIs,
// chrome-devtools-mcp) and the agents' hosts. They are what `agent-vm
// setup` pins (Pin) when this host's resolver answers them with an address
// the proxy refuses, and what doctor's egress check resolves.
var PackageSources = slices.Concat(DebianMirrors, []string{NPMRegistry}, AgentHosts)

// Policy is one VM's egress policy, as the proxy reads it.
type Policy struct {
	// Branch names the VM in the proxy's denial messages.
	Branch string `json:"branch"`
	Mode   string `json:"mode"`
	// Allow are patterns the VM may reach (mode allow): a host name, a
	// suffix wildcard "*.example.com" (which matches example.com's
	// subdomains, not example.com), or an IP address.
	Allow []string `json:"allow"`
	// Deny are patterns refused in every mode (`agent-vm net deny`).
	Deny []string `json:"deny,omitempty"`
	// Exposed are the host ports (on 127.0.0.1) the guest may reach
	// through the exposed-port socket.
	Exposed []int `json:"exposed,omitempty"`
	// Requests are the rules for the requests the proxy reads (those to
	// the hosts it intercepts), tried in order, each a string
	// "allow|deny METHOD host/path" (request.go).
	Requests []RequestRule `json:"requests,omitempty"`
	// Pins are the host's pins (Pin): each lets one address that is not
	// globally reachable through for one name.
	Pins []Pin `json:"pins,omitempty"`
	// AskWait is how long, in seconds, mode ask holds a connection for the
	// user's answer; 0 is DefaultAskWait.
	AskWait int `json:"ask_wait_s,omitempty"`
}

// Pin is a name and an address of it that the proxy connects to although
// the address is not globally reachable: the host's resolver answers the
// name with it (a gateway, a mirror, split DNS), and `agent-vm setup`
// recorded that (internal/pins). It lets the address through for that
// name alone: another name that resolves to it is still refused. No pin
// lets one of the host's own addresses through.
type Pin struct {
	Name string     `json:"name"`
	Addr netip.Addr `json:"addr"`
}

// String is "name → addr".
func (p Pin) String() string { return p.Name + " → " + p.Addr.String() }

// pinned reports whether a pin lets a through for host.
func (p Policy) pinned(host string, a netip.Addr) bool {
	h, a := normalize(host), a.Unmap().WithZone("")
	return slices.ContainsFunc(p.Pins, func(pin Pin) bool { return normalize(pin.Name) == h && pin.Addr.Unmap() == a })
}

// Decision is the policy's answer for one destination, and the rule that
// made it.
type Decision struct {
	Allowed bool
	Rule    string
	// Ask: refused only for not being on the allow-list, in mode ask, so
	// the user is asked.
	Ask bool
}

// Rules that refuse, which the denial's hint answers (Fix).
const (
	ruleDeny    = "deny "
	ruleOffline = "mode offline"
	// RuleAddresses refuses a name the policy allows whose every address
	// the proxy refuses (Judge) and no pin lets through: the entry's
	// Refused says which and why.
	RuleAddresses = "its addresses are refused"
)

// Decide says whether the VM may connect to host (a name or an IP literal,
// without port).
func (p Policy) Decide(host string) Decision {
	h := normalize(host)
	if pat, ok := match(p.Deny, h); ok {
		return Decision{Rule: ruleDeny + pat}
	}
	switch p.Mode {
	case ModeOffline:
		return Decision{Rule: ruleOffline}
	case ModeOpen:
		return Decision{Allowed: true, Rule: "mode open"}
	}
	if pat, ok := match(p.Allow, h); ok {
		return Decision{Allowed: true, Rule: "allow " + pat}
	}
	ask := p.Mode == ModeAsk
	if _, err := netip.ParseAddr(h); err == nil {
		return Decision{Rule: "IP address not on the allow-list", Ask: ask}
	}
	return Decision{Rule: "not on the allow-list", Ask: ask}
}

// Exposes reports whether host port is exposed to the guest.
func (p Policy) Exposes(port int) bool { return slices.Contains(p.Exposed, port) }

// match finds the first pattern that matches host.
func match(patterns []string, host string) (string, bool) {
	for _, pat := range patterns {
		if matches(pat, host) {
			return pat, true
		}
	}
	return "", false
}

func matches(pattern, host string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	if a, err := netip.ParseAddr(pattern); err == nil {
		b, err := netip.ParseAddr(host)
		return err == nil && a.Unmap() == b.Unmap()
	}
	return pattern == host
}

// normalize lowercases a host and strips a trailing dot and IPv6 brackets.
func normalize(host string) string {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	return strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
}

// CheckPattern validates and normalizes a pattern given on the command
// line (`net allow|deny`, create): a host name, "*." and a domain, or an
// IP address.
func CheckPattern(s string) (string, error) {
	p := normalize(strings.TrimSpace(s))
	if _, err := netip.ParseAddr(p); err == nil {
		return p, nil
	}
	name := strings.TrimPrefix(p, "*.")
	if name == "" || len(name) > 253 || strings.Contains(name, "*") || !validName(name) {
		return "", fmt.Errorf("%q is not a domain name, a wildcard (*.example.com) or an IP address", s)
	}
	return p, nil
}

func validName(name string) bool {
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// CheckMode validates a mode name.
func CheckMode(mode string) error {
	if slices.Contains(Modes, mode) {
		return nil
	}
	return fmt.Errorf("--net %q is not a network mode (hint: one of %s)", mode, strings.Join(Modes, ", "))
}

// The files of a VM's network directory.
const (
	PolicyFile = "policy.json"
	LogFile    = "net.log"
)

// WritePolicy replaces the policy file of the network directory dir
// atomically (0600): the proxy never reads half of it. The file belongs to
// dir's owner, who the proxy runs as (a root agent-vm writes it for a
// proxy that dropped to the workspace's owner).
func WritePolicy(dir string, p Policy) error {
	return writeOwned(dir, PolicyFile, p)
}

// writeOwned replaces the file name of the network directory dir with v as
// JSON, atomically, 0600 and dir owner's.
func writeOwned(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	owner, err := ownerOf(dir)
	if err != nil {
		return err
	}
	return atomicfile.WriteFrom(filepath.Join(dir, name), 0o600, func(w io.Writer) error {
		if f, ok := w.(*os.File); ok && owner != nil && os.Geteuid() == 0 {
			if err := f.Chown(int(owner.Uid), int(owner.Gid)); err != nil {
				return err
			}
		}
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// ownerOf is the owner of dir when it is not the caller.
func ownerOf(dir string) (*syscall.Stat_t, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	if int(st.Uid) == os.Geteuid() {
		return nil, nil
	}
	return st, nil
}

// ReadPolicy reads the policy file of the network directory dir. A missing
// file is an error: the proxy then allows nothing.
func ReadPolicy(dir string) (Policy, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return Policy{}, err
	}
	defer r.Close()
	return readPolicyIn(r)
}

func readPolicyIn(dir *os.Root) (Policy, error) {
	b, err := dir.ReadFile(PolicyFile)
	if err != nil {
		return Policy{}, err
	}
	var p Policy
	if err := json.Unmarshal(b, &p); err != nil {
		return Policy{}, fmt.Errorf("%s: %w", PolicyFile, err)
	}
	if err := CheckMode(p.Mode); err != nil {
		return Policy{}, fmt.Errorf("%s: %w", PolicyFile, err)
	}
	return p, nil
}

// errNoPolicy is what the proxy decides on when its policy is unreadable.
var errNoPolicy = errors.New("the VM's network policy is unreadable")

// PinLines are pins as doctor and net show print them: one line an
// address, with the names it is pinned for (escaped for a terminal).
func PinLines(ps []Pin) []string {
	var addrs []netip.Addr
	names := map[netip.Addr][]string{}
	for _, p := range ps {
		if _, ok := names[p.Addr]; !ok {
			addrs = append(addrs, p.Addr)
		}
		names[p.Addr] = append(names[p.Addr], termsafe.String(p.Name))
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, fmt.Sprintf("%s for %s", a, strings.Join(names[a], ", ")))
	}
	return out
}
