package hostlink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sshx"
)

// A Tunnel carries TCP connections through the link: each Dial is an SSH
// direct-tcpip channel that the host's sshd connects to its address, so a
// guest on a network of the host's is reached from this machine with
// nothing listening on the host. It is what a VM's forwards (`net-forward
// --via-addr`) dial when the VM runs on another host.
//
// The key and the pinned host key are read once, by NewTunnel: net-forward
// drops root's privileges once it listens, after which it could no longer
// read root's 0600 key, and a link that dropped must still be made again.
// One SSH connection, made at the first Dial, carries every channel; a
// Dial that finds it dead makes a new one once. Keepalives notice a link
// that went silent (a host rebooted, a network gone) and close it, so the
// next Dial reconnects rather than waiting on it.
type Tunnel struct {
	target Target
	cfg    *ssh.ClientConfig
	// every is how often a keepalive asks the host; KeepaliveInterval
	// but in tests.
	every time.Duration

	mu      sync.Mutex
	held    *heldLink // nil before the first Dial and once it is dropped
	refused error     // a host key other than the pinned one: every Dial's answer
	closed  bool
}

// heldLink is one SSH connection of a Tunnel's.
type heldLink struct {
	c    *ssh.Client
	dead chan struct{} // closed once the connection has ended
}

// KeepaliveInterval is how often a Tunnel asks the host whether the link
// is alive (OpenSSH's keepalive@openssh.com, as ssh's ServerAliveInterval
// does); KeepaliveMissed intervals without an answer close the link.
const (
	KeepaliveInterval = 15 * time.Second
	KeepaliveMissed   = 3
)

// NewTunnel reads t's key and pinned host key and returns a Tunnel to t;
// it connects at the first Dial. Close it when done.
func NewTunnel(t Target) (*Tunnel, error) {
	cfg, err := t.sshxTarget().Config(Timeout)
	if err != nil {
		return nil, fmt.Errorf("preparing the link to %s: %w (hint: `agent-vm host link` makes agent-vm's key for a host and pins its host key)", t.Addr, err)
	}
	return &Tunnel{target: t, cfg: cfg, every: KeepaliveInterval}, nil
}

// ErrTunnelClosed is Dial's answer once the Tunnel is closed.
var ErrTunnelClosed = errors.New("the tunnel is closed")

// Dial opens a connection to addr ("host:port", as the host resolves and
// reaches it) through the link; it fits tcpfwd.Dialer. The link is made
// at the first Dial and made again, once, when the one held has ended. A
// host key other than the pinned one is never retried: this Dial and
// every later one fail with it.
func (t *Tunnel) Dial(ctx context.Context, addr string) (net.Conn, error) {
	for retried := false; ; retried = true {
		l, fresh, err := t.link(ctx)
		if err != nil {
			return nil, fmt.Errorf("opening a connection to %s: %w", addr, err)
		}
		conn, err := l.c.DialContext(ctx, "tcp", addr)
		if err == nil {
			return conn, nil
		}
		var refused *ssh.OpenChannelError
		if errors.As(err, &refused) {
			// The host answered: its sshd could not or would not connect.
			return nil, fmt.Errorf("opening a connection to %s through %s: %w (hint: is anything listening at %s, reached from the host? the host's sshd must allow it, AllowTcpForwarding yes)", addr, t.target.Addr, err, addr)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("opening a connection to %s through %s: %w", addr, t.target.Addr, ctx.Err())
		}
		// The connection itself failed: it is dead even if its end has
		// not been seen yet. One held from before is made again once.
		t.drop(l)
		if fresh || retried {
			return nil, fmt.Errorf("opening a connection to %s through %s: the link dropped: %w (hint: is the host up, and its sshd?)", addr, t.target.Addr, err)
		}
	}
}

// link returns the held connection, first making one if there is none or
// it has ended; fresh says it was made now. Concurrent Dials wait for one
// another here, so they share one connection.
func (t *Tunnel) link(ctx context.Context) (l *heldLink, fresh bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return nil, false, ErrTunnelClosed
	case t.refused != nil:
		return nil, false, t.refused
	case t.held != nil:
		select {
		case <-t.held.dead:
			t.held = nil
		default:
			return t.held, false, nil
		}
	}
	c, err := sshx.DialConfig(ctx, t.target.Addr, t.cfg, Timeout)
	if err != nil {
		err = linkError(t.target, err)
		if errors.Is(err, sshx.ErrHostKeyMismatch) {
			t.refused = err
		}
		return nil, false, err
	}
	l = &heldLink{c: c, dead: make(chan struct{})}
	go func() {
		_ = c.Wait()
		close(l.dead)
	}()
	go keepalive(c, l.dead, t.every)
	t.held = l
	return l, true, nil
}

// drop closes l and forgets it, unless another Dial has replaced it
// already.
func (t *Tunnel) drop(l *heldLink) {
	t.mu.Lock()
	if t.held == l {
		t.held = nil
	}
	t.mu.Unlock()
	l.c.Close()
}

// Close closes the held connection, and with it every connection Dial
// returned; later Dials fail with ErrTunnelClosed.
func (t *Tunnel) Close() {
	t.mu.Lock()
	l := t.held
	t.held, t.closed = nil, true
	t.mu.Unlock()
	if l != nil {
		l.c.Close()
	}
}

// keepalive closes c when the host leaves KeepaliveMissed keepalives in
// a row unanswered (sshx.Keepalive), until c has ended (dead).
func keepalive(c *ssh.Client, dead <-chan struct{}, every time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-dead
		cancel()
	}()
	if err := sshx.Keepalive(ctx, c, every, KeepaliveMissed, nil); err != nil {
		c.Close()
	}
}
