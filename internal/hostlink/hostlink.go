// Package hostlink is agent-vm's own way into a libvirt host it may place
// VMs on: an SSH connection (internal/sshx) that accepts only the host key
// pinned when the host was added and logs in with a key pair of agent-vm's
// made for that host, never the user's ~/.ssh, agent or ssh_config; and
// libvirt's RPC over it (github.com/digitalocean/go-libvirt, pure Go), a
// channel to the system daemon's unix socket on the host (OpenSSH's
// direct-streamlocal), so no TCP port of libvirt's opens anywhere.
//
// Why go-libvirt rather than virsh through the user's SSH (what `host
// doctor` did first): one connection carries every call, the pinned key is
// checked by agent-vm, and a call is a function with typed answers rather
// than a virsh process, an SSH handshake and text to parse each. A
// read-write connection to the system daemon is as good as root on the
// host, which is why the key is agent-vm's own and the host key pinned.
//
// `host doctor` asks the host through it, and a VM placed on a host is
// run there by agent-vm's own binary, which Install copies over it
// (DialAgent), one connection per request. A Tunnel
// carries TCP connections over it (direct-tcpip channels the host's sshd
// connects) to addresses the host reaches: the forwards of a VM placed
// there, listening on this machine's loopback (`net-forward --via-addr`).
package hostlink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
)

// Socket is the system libvirt daemon's socket on a host.
const Socket = "/var/run/libvirt/libvirt-sock"

// DefaultDir is agent-vm's directory on a host VMs are placed on, unless
// the host's entry names another: its binary, storage pool, and the files
// of each VM placed there.
const DefaultDir = "/var/lib/agent-vm"

// Timeout bounds a connection's handshake.
const Timeout = 20 * time.Second

// Target is a host as the link reaches it.
type Target struct {
	// Addr is the host's sshd, "host:port".
	Addr string
	User string
	// KeyFile is agent-vm's private key for the host; KnownHosts the
	// file pinning the host's key (PinLine).
	KeyFile, KnownHosts string
}

// ScanHostKey connects to addr's sshd only to learn its ed25519 host key
// (the one kind the link accepts), and authenticates nothing.
func ScanHostKey(ctx context.Context, addr string) (ssh.PublicKey, error) {
	var key ssh.PublicKey
	errGot := errors.New("host key read")
	cfg := &ssh.ClientConfig{
		User:              "agent-vm-host-key-scan",
		HostKeyAlgorithms: []string{ssh.KeyAlgoED25519},
		HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
			key = k
			return errGot
		},
		Timeout: Timeout,
	}
	d := net.Dialer{Timeout: Timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("reaching %s's sshd: %w", addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(Timeout))
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	_, _, _, err = ssh.NewClientConn(conn, addr, cfg)
	if key != nil {
		return key, nil
	}
	if err != nil && strings.Contains(err.Error(), "no common algorithm") {
		return nil, fmt.Errorf("%s's sshd has no ed25519 host key, the one kind agent-vm pins (hint: `ssh-keygen -A` on the host makes one)", addr)
	}
	return nil, fmt.Errorf("reading %s's host key: %w", addr, err)
}

// Fingerprint is key's SHA256 fingerprint, as ssh-keygen -l shows it.
func Fingerprint(key ssh.PublicKey) string { return ssh.FingerprintSHA256(key) }

// PinLine is the known_hosts line pinning key for addr.
func PinLine(addr string, key ssh.PublicKey) string {
	return knownhosts.Line([]string{knownhosts.Normalize(addr)}, key) + "\n"
}

// Dial opens the link: SSH with the pinned host key and agent-vm's key.
func Dial(ctx context.Context, t Target) (*ssh.Client, error) {
	c, err := sshx.Dial(ctx, t.sshxTarget(), Timeout)
	if err != nil {
		return nil, linkError(t, err)
	}
	return c, nil
}

// sshxTarget is t as internal/sshx takes it.
func (t Target) sshxTarget() sshx.Target {
	return sshx.Target{Addr: t.Addr, User: t.User, KeyFile: t.KeyFile, KnownHosts: t.KnownHosts}
}

// linkError is a failure to open the link to t, naming the host and what
// to do.
func linkError(t Target, err error) error {
	if errors.Is(err, sshx.ErrHostKeyMismatch) {
		return fmt.Errorf("%s answered with a host key other than the one pinned when the host was added: %w (hint: if the host was reinstalled, `agent-vm host rm` and `host add` it again, checking the new fingerprint; else do not connect)", t.Addr, err)
	}
	var ce *ssh.ServerAuthError
	if errors.As(err, &ce) || strings.Contains(err.Error(), "unable to authenticate") {
		pub := t.KeyFile + ".pub"
		return fmt.Errorf("%s does not accept agent-vm's key for it as %s: %w (hint: add the line of %s to ~%s/.ssh/authorized_keys on the host)", t.Addr, t.User, err, pub, t.User)
	}
	return fmt.Errorf("reaching %s over SSH: %w (hint: is the host up, and its sshd listening at that address?)", t.Addr, err)
}

// dialer opens libvirt's socket on the host through the link.
type dialer struct{ c *ssh.Client }

func (d dialer) Dial() (net.Conn, error) {
	conn, err := d.c.Dial("unix", Socket)
	if err != nil {
		return nil, fmt.Errorf("opening %s on the host through SSH: %w (hint: is libvirtd running there, and does its sshd allow stream-local forwarding, AllowStreamLocalForwarding?)", Socket, err)
	}
	return conn, nil
}

// Libvirt connects to the host's system libvirt daemon over c. Close the
// answer with Disconnect.
func Libvirt(c *ssh.Client) (*libvirt.Libvirt, error) {
	l := libvirt.NewWithDialer(dialer{c})
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return nil, fmt.Errorf("connecting to libvirt on the host: %w", err)
	}
	return l, nil
}

// Keys makes agent-vm's key pair for a host at keyFile (and keyFile.pub),
// 0600, and returns the public half's authorized_keys line.
func Keys(keyFile, comment string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(keyFile), 0o700); err != nil {
		return "", err
	}
	p, err := sshkeys.Generate(comment)
	if err != nil {
		return "", err
	}
	if err := p.Write(keyFile); err != nil {
		return "", err
	}
	return strings.TrimSpace(string(p.AuthorizedKey)), nil
}

// Addr is the sshd address of a qemu+ssh URI's host and port ("" port:
// 22).
func Addr(host, port string) string {
	if port == "" {
		port = strconv.Itoa(22)
	}
	return net.JoinHostPort(host, port)
}

// formatVersion is libvirt's version number (major*1e6 + minor*1e3 +
// release) as libvirt prints it.
func formatVersion(v uint64) string {
	return fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000)
}
