package hosts

import (
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// URI is a libvirt connection URI agent-vm accepts for a host, read by
// ParseURI.
type URI struct {
	// Raw is the URI as the user gave it (what is stored and shown).
	Raw string
	// Transport is "" (qemu:///system: the local daemon's socket),
	// "unix" or "ssh".
	Transport string
	// User, Host and Port are the SSH login of a qemu+ssh URI ("" and 0:
	// ssh's own defaults, from ~/.ssh/config).
	User string
	Host string
	Port int
	// Daemon is "system" or "session".
	Daemon string
	// Keyfile is the keyfile= parameter of a qemu+ssh URI: the private
	// key ssh logs in with ("" for ssh's defaults and agent).
	Keyfile string
}

// Remote reports whether the URI reaches another machine (qemu+ssh).
func (u URI) Remote() bool { return u.Transport == "ssh" }

// ForChecks is the URI the doctor's virsh calls use: for qemu+ssh with
// no_tty=1, so that ssh never stops to ask for a password or a host
// key's confirmation (libvirt then runs it with BatchMode=yes) and a
// host that needs either fails at once instead of hanging.
func (u URI) ForChecks() string {
	if !u.Remote() {
		return u.Raw
	}
	if strings.Contains(u.Raw, "?") {
		return u.Raw + "&no_tty=1"
	}
	return u.Raw + "?no_tty=1"
}

// SSHTarget is where ssh logs in for a qemu+ssh URI: [user@]host.
func (u URI) SSHTarget() string {
	if u.User == "" {
		return u.Host
	}
	return u.User + "@" + u.Host
}

const uriHint = "(hint: qemu:///system for this machine's libvirtd, qemu+ssh://USER@HOST/system for another machine's)"

var (
	// passwordRE finds the password of a URI's user information
	// (scheme://user:password@), well-formed or not.
	passwordRE = regexp.MustCompile(`^([^:/?#]+://[^/?#@:]*):[^/?#]*@`)
	userRE     = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$`)
	labelRE    = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
)

// ParseURI reads s as one of the libvirt URIs agent-vm accepts:
// qemu:///system, qemu:///session, qemu+unix:///system (or /session),
// and qemu+ssh://[user@]host[:port]/system (or /session) with at most a
// keyfile= parameter. Everything else is refused with the reason:
// qemu+tcp has no authentication and no encryption; qemu+tls needs a PKI
// (a CA and client and server certificates) agent-vm does not set up;
// qemu+libssh and qemu+libssh2 do not use ssh's own configuration and
// agent the way qemu+ssh (the ssh program) does; and parameters that turn
// off host key checking or that agent-vm sets itself are refused.
func ParseURI(s string) (URI, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return URI{}, fmt.Errorf("the libvirt URI is empty %s", uriHint)
	}
	if shown := passwordRE.ReplaceAllString(s, "${1}:xxxxx@"); shown != s {
		// Checked first, so that no other error quotes the password.
		return URI{}, fmt.Errorf("libvirt URI %q holds a password; agent-vm never stores one (hint: log in with an SSH key: ssh-copy-id, then qemu+ssh://USER@HOST/system)", shown)
	}
	pu, err := url.Parse(s)
	if err != nil || pu.Scheme == "" || pu.Opaque != "" {
		return URI{}, fmt.Errorf("%q is not a libvirt URI %s", s, uriHint)
	}
	u := URI{Raw: s}
	driver, transport, _ := strings.Cut(strings.ToLower(pu.Scheme), "+")
	if driver != "qemu" {
		return URI{}, fmt.Errorf("libvirt URI %q names the %s driver; agent-vm runs QEMU guests, so the URI starts with qemu %s", s, driver, uriHint)
	}
	if err := checkTransport(s, transport); err != nil {
		return URI{}, err
	}
	u.Transport = transport
	if pu.Fragment != "" || pu.RawFragment != "" || strings.Contains(s, "#") {
		return URI{}, fmt.Errorf("libvirt URI %q has a fragment (#...), which libvirt does not use %s", s, uriHint)
	}
	switch pu.Path {
	case "/system", "/session":
		u.Daemon = pu.Path[1:]
	default:
		return URI{}, fmt.Errorf("libvirt URI %q has path %q; QEMU's daemons are /system and /session %s", s, pu.Path, uriHint)
	}
	if transport != "ssh" {
		if pu.Host != "" || pu.User != nil {
			return URI{}, fmt.Errorf("libvirt URI %q names a host without a transport, which libvirt reaches over TLS (a PKI agent-vm does not set up) (hint: qemu+ssh://USER@%s/%s)", s, pu.Hostname(), u.Daemon)
		}
		if pu.RawQuery != "" || pu.ForceQuery {
			return URI{}, fmt.Errorf("libvirt URI %q has parameters (%s); agent-vm takes none for this machine's libvirtd (hint: qemu:///%s)", s, pu.RawQuery, u.Daemon)
		}
		return u, nil
	}
	if err := u.readSSH(pu); err != nil {
		return URI{}, err
	}
	return u, nil
}

// checkTransport refuses every transport but the local socket and ssh,
// saying why.
func checkTransport(s, transport string) error {
	switch transport {
	case "", "unix", "ssh":
		return nil
	case "tcp":
		return fmt.Errorf("libvirt URI %q uses qemu+tcp, which has no authentication and no encryption: anyone who reaches the port controls the host's VMs (hint: use qemu+ssh://USER@HOST/system)", s)
	case "tls":
		return fmt.Errorf("libvirt URI %q uses qemu+tls, which needs a PKI (a CA, client and server certificates) that agent-vm does not set up (hint: use qemu+ssh://USER@HOST/system, which needs only SSH access)", s)
	case "libssh", "libssh2":
		return fmt.Errorf("libvirt URI %q uses qemu+%s, which does not read ~/.ssh/config or use ssh-agent the way the ssh program does, and asks about unknown host keys (hint: use qemu+ssh://USER@HOST/system)", s, transport)
	}
	return fmt.Errorf("libvirt URI %q uses transport %q, which agent-vm does not support (hint: qemu+ssh://USER@HOST/system for another machine, qemu:///system for this one)", s, transport)
}

// readSSH reads the login and the parameters of a qemu+ssh URI.
func (u *URI) readSSH(pu *url.URL) error {
	s := u.Raw
	u.Host = pu.Hostname()
	if u.Host == "" {
		return fmt.Errorf("libvirt URI %q names no host (hint: qemu+ssh://USER@HOST/%s)", s, u.Daemon)
	}
	if !validHost(u.Host) {
		return fmt.Errorf("libvirt URI %q: %q is not a host name or IP address (hint: qemu+ssh://USER@HOST/%s, HOST as ssh knows it)", s, u.Host, u.Daemon)
	}
	if p := pu.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("libvirt URI %q: port %q is not a port number 1-65535", s, p)
		}
		u.Port = n
	} else if strings.HasSuffix(pu.Host, ":") {
		return fmt.Errorf("libvirt URI %q has an empty port (hint: leave out the colon for ssh's port 22, or give the port)", s)
	}
	if pu.User != nil {
		u.User = pu.User.Username()
		if !userRE.MatchString(u.User) {
			return fmt.Errorf("libvirt URI %q: %q is not a user name (hint: letters, digits, '.', '_' and '-', not starting with '-' or '.')", s, u.User)
		}
	}
	if pu.ForceQuery && pu.RawQuery == "" {
		return fmt.Errorf("libvirt URI %q ends in an empty '?' (hint: leave it out, or add keyfile=/path/to/key)", s)
	}
	q, err := url.ParseQuery(pu.RawQuery)
	if err != nil {
		return fmt.Errorf("libvirt URI %q: its parameters cannot be read: %v", s, err)
	}
	for k, vs := range q {
		if len(vs) > 1 {
			return fmt.Errorf("libvirt URI %q gives %s more than once", s, k)
		}
		if err := checkParam(s, k, vs[0]); err != nil {
			return err
		}
	}
	u.Keyfile = q.Get("keyfile")
	return nil
}

// checkParam allows keyfile= (an absolute path) and refuses every other
// parameter of a qemu+ssh URI, saying why.
func checkParam(s, k, v string) error {
	switch k {
	case "keyfile":
		if !filepath.IsAbs(v) {
			return fmt.Errorf("libvirt URI %q: keyfile %q is not an absolute path (hint: keyfile=/home/you/.ssh/id_ed25519)", s, v)
		}
		return nil
	case "no_verify":
		return fmt.Errorf("libvirt URI %q sets no_verify, which skips ssh's host key check and accepts any new host's key: a machine that takes over the name would get this user's VMs (hint: leave it out; ssh to the host once and check its key, so it is in ~/.ssh/known_hosts)", s)
	case "known_hosts", "known_hosts_verify", "sshauth":
		return fmt.Errorf("libvirt URI %q sets %s, which only qemu+libssh and qemu+libssh2 read: qemu+ssh runs the ssh program, which would ignore it (hint: leave it out, and give ssh the file in ~/.ssh/config: Host HOST / UserKnownHostsFile FILE)", s, k)
	case "no_tty":
		return fmt.Errorf("libvirt URI %q sets no_tty; agent-vm adds no_tty=1 itself where it must not be asked anything (hint: leave it out)", s)
	}
	return fmt.Errorf("libvirt URI %q sets %s, which agent-vm does not support (hint: qemu+ssh://USER@HOST/system with at most keyfile=/path/to/key; ssh's own settings go in ~/.ssh/config)", s, k)
}

// validHost is a DNS name or an IP address, which is all ssh gets as
// its destination (never something starting with '-', an option).
func validHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if !labelRE.MatchString(l) {
			return false
		}
	}
	return true
}
