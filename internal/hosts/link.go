package hosts

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/flock"
	"github.com/agent-vm/agent-vm/internal/hostlink"
)

// Link is agent-vm's own SSH link to a qemu+ssh host (internal/hostlink),
// set up by `host link`: the host's key pinned in KnownHosts, agent-vm's
// key pair for the host in KeyFile (and KeyFile.pub), next to the host's
// file. VMs placed on the host are reached through it, and `host doctor`
// checks the host over it.
type Link struct {
	Addr string `json:"addr"`
	User string `json:"user"`
	// Fingerprint is the pinned host key's (SHA256:...).
	Fingerprint string `json:"host_key"`
	KeyFile     string `json:"key_file"`
	KnownHosts  string `json:"-"`
}

// Target is where hostlink.Dial goes for l.
func (l Link) Target() hostlink.Target {
	return hostlink.Target{Addr: l.Addr, User: l.User, KeyFile: l.KeyFile, KnownHosts: l.KnownHosts}
}

func (r *Registry) keyFile(name string) string { return filepath.Join(r.Dir.Path, name+".key") }
func (r *Registry) pinFile(name string) string { return filepath.Join(r.Dir.Path, name+".known_hosts") }

// linkOf reads h's link from its files; nil when `host link` never ran.
func (r *Registry) linkOf(h Host) (*Link, error) {
	b, err := os.ReadFile(r.pinFile(h.Name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	_, _, key, _, _, err := ssh.ParseKnownHosts(b)
	if err != nil {
		return nil, fmt.Errorf("the pinned host key of %s (%s) is damaged: %v (hint: `agent-vm host link %s` again)", h.Name, r.pinFile(h.Name), err, h.Name)
	}
	u, err := ParseURI(h.URI)
	if err != nil {
		return nil, err
	}
	return &Link{Addr: linkAddr(u), User: linkUser(u), Fingerprint: hostlink.Fingerprint(key), KeyFile: r.keyFile(h.Name), KnownHosts: r.pinFile(h.Name)}, nil
}

func linkAddr(u URI) string {
	port := ""
	if u.Port != 0 {
		port = strconv.Itoa(u.Port)
	}
	return hostlink.Addr(u.Host, port)
}

// linkUser is the URI's user, else this user's name, as ssh would take.
func linkUser(u URI) string {
	if u.User != "" {
		return u.User
	}
	if me, err := user.Current(); err == nil {
		return me.Username
	}
	return "root"
}

// LinkOptions say whose word pins a host's key.
type LinkOptions struct {
	// HostKey, when set, is the fingerprint the user already checked
	// (--host-key): the host's key must be that one.
	HostKey string
	// Confirm, when HostKey is "", asks the user whether fingerprint is the
	// host's; nil or an error: nothing is pinned.
	Confirm func(addr, fingerprint string) (bool, error)
}

// LinkResult is what `host link` made.
type LinkResult struct {
	Link Link `json:"link"`
	// PublicKey is agent-vm's key for the host, the line to add to the
	// host's authorized_keys; NewKey says it was made now (a second link
	// keeps the first key, so nothing needs installing again).
	PublicKey string `json:"public_key"`
	NewKey    bool   `json:"new_key"`
}

// ErrNotConfirmed is a host key the user did not confirm.
var ErrNotConfirmed = errors.New("host key not confirmed")

// LinkHost sets up agent-vm's link to the qemu+ssh host name: it reads
// the host's ed25519 key from its sshd, pins it once the user's word says
// it is the host's (opts), and makes agent-vm's key pair for the host
// unless one is there. Nothing is written when the key is not confirmed or
// the host cannot be reached.
func (r *Registry) LinkHost(ctx context.Context, name string, opts LinkOptions) (LinkResult, error) {
	h, err := r.Get(name)
	if err != nil {
		return LinkResult{}, err
	}
	u, err := ParseURI(h.URI)
	if err != nil {
		return LinkResult{}, err
	}
	if !u.Remote() {
		return LinkResult{}, fmt.Errorf("host %s is %s, this machine's libvirtd: there is no SSH link to set up (hint: `host link` is for qemu+ssh hosts)", name, h.URI)
	}
	addr := linkAddr(u)
	key, err := hostlink.ScanHostKey(ctx, addr)
	if err != nil {
		return LinkResult{}, fmt.Errorf("host %s: %w", name, err)
	}
	fp := hostlink.Fingerprint(key)
	switch {
	case opts.HostKey != "" && opts.HostKey != fp:
		return LinkResult{}, fmt.Errorf("host %s (%s) presents host key %s, not the %s you gave: nothing pinned (hint: check the key on the host, `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`; a different one may mean someone is in between)", name, addr, fp, opts.HostKey)
	case opts.HostKey == "" && opts.Confirm == nil:
		return LinkResult{}, fmt.Errorf("host %s (%s) presents host key %s: %w (hint: check it on the host, `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`, then `agent-vm host link %s --host-key %s`)", name, addr, fp, ErrNotConfirmed, name, fp)
	case opts.HostKey == "":
		ok, err := opts.Confirm(addr, fp)
		if err != nil {
			return LinkResult{}, err
		}
		if !ok {
			return LinkResult{}, fmt.Errorf("host %s: %w: nothing pinned", name, ErrNotConfirmed)
		}
	}
	lock, err := flock.Acquire(ctx, filepath.Join(r.Dir.Path, lockFile), 0o600, nil)
	if err != nil {
		return LinkResult{}, fmt.Errorf("locking the hosts registry: %w", err)
	}
	defer lock.Release()
	if _, err := r.Get(name); err != nil { // removed meanwhile
		return LinkResult{}, err
	}
	res := LinkResult{}
	if b, err := os.ReadFile(r.keyFile(name) + ".pub"); err == nil {
		if _, err := os.Stat(r.keyFile(name)); err != nil {
			return LinkResult{}, fmt.Errorf("agent-vm's key for host %s is half there (%s without its private half) (hint: remove %s.pub and link again)", name, r.keyFile(name)+".pub", r.keyFile(name))
		}
		res.PublicKey = string(trimNL(b))
	} else {
		if res.PublicKey, err = hostlink.Keys(r.keyFile(name), "agent-vm host "+name); err != nil {
			return LinkResult{}, fmt.Errorf("making agent-vm's key for host %s: %w", name, err)
		}
		res.NewKey = true
	}
	if err := atomicfile.Write(r.pinFile(name), []byte(hostlink.PinLine(addr, key)), 0o600); err != nil {
		return LinkResult{}, fmt.Errorf("pinning host %s's key: %w", name, err)
	}
	l, err := r.linkOf(h)
	if err != nil || l == nil {
		return LinkResult{}, fmt.Errorf("reading back host %s's link: %v", name, err)
	}
	res.Link = *l
	return res, nil
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// removeLink deletes name's link files, those there are.
func (r *Registry) removeLink(name string) error {
	var errs []error
	for _, p := range []string{r.pinFile(name), r.keyFile(name), r.keyFile(name) + ".pub"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// linkCheck is host doctor's line for agent-vm's own link: not set up
// (informational: nothing needs it until VMs are placed on hosts), or
// SSH with the pinned key and agent-vm's key, and libvirt over it.
func linkCheck(ctx context.Context, h Host) Check {
	c := Check{Name: "agent-vm's link"}
	if h.Link == nil {
		c.OK = true
		c.Detail = "not set up: placing VMs on this host will need it"
		c.Hint = "`agent-vm host link " + h.Name + "` pins the host's key and makes agent-vm's own key for it"
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, hostlink.Timeout)
	defer cancel()
	cl, err := hostlink.Dial(ctx, h.Link.Target())
	if err != nil {
		c.Detail = oneLine(err)
		return c
	}
	defer cl.Close()
	l, err := hostlink.Libvirt(cl)
	if err != nil {
		c.Detail = oneLine(err)
		c.Hint = "libvirtd must run on the host, and " + h.Link.User + " may use its system socket (root, or the libvirt group)"
		return c
	}
	defer l.Disconnect()
	v, err := l.ConnectGetLibVersion()
	if err != nil {
		c.Detail = "libvirt over the link: " + oneLine(err)
		return c
	}
	c.OK = true
	c.Detail = fmt.Sprintf("SSH as %s with host key %s pinned and agent-vm's key; libvirt %d.%d.%d over it", h.Link.User, h.Link.Fingerprint, v/1000000, v/1000%1000, v%1000)
	return c
}
