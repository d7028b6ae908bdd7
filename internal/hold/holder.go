package hold

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/sockdir"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
)

// Holder holds a connection to one guest and serves it on Files.Socket.
type Holder struct {
	Files Files
	// RunDir is the VM's run directory (the socket's directory is made
	// for it, see sockdir.Ensure).
	RunDir string
	// Dial connects to the guest (sshx.Dial with the VM's target): once at
	// the start, and again when the guest refuses a channel for its
	// per-connection session cap.
	Dial func(ctx context.Context) (*ssh.Client, error)
	Log  hclog.Logger
	// Keepalive is how often the guest must answer (0: 15 s); after three
	// unanswered, the holder ends.
	Keepalive time.Duration
	// Asleep, when set, says that the guest is paused on purpose (a
	// hibernated VM): no keepalive is asked of it then, and the held
	// connection waits for it to run again.
	Asleep func() bool
	// ReverseForwards says which reverse forwards to keep open on the held
	// connection (nil: none): read when the holder starts and at each
	// ReloadRequest.
	ReverseForwards func() ([]ReverseForward, error)
	// Notices, when set, passes the reverse forwards' lines for the user to the
	// callers listening on a NoticesChannel.
	Notices *Notices
	// Watch, when set, runs beside the held connection c for as long as it
	// lasts (the agents' states: internal/notify; idleness: internal/idle).
	Watch func(ctx context.Context, c *ssh.Client)

	own      atomic.Pointer[[]string] // its connections' local ends now (guests.note)
	mu       sync.Mutex
	channels map[*int]time.Time // callers' channels relayed now, from when
}

// InUse is how many callers' channels the holder has relayed for at least
// age now (an attach, a shell, a long command; not a quick look at the
// sessions), and the local ends ("IP:PORT") of the connections to the
// guest it holds (the held one, and more when the guest caps the sessions
// of one): a watch of the guest's ports tells its own from clients' by
// them.
func (h *Holder) InUse(age time.Duration) (channels int, own []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.channels {
		if time.Since(t) >= age {
			channels++
		}
	}
	if p := h.own.Load(); p != nil {
		own = *p
	}
	return channels, own
}

// relaying notes a caller's channel until the returned func is called.
func (h *Holder) relaying() func() {
	id := new(int)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.channels == nil {
		h.channels = map[*int]time.Time{}
	}
	h.channels[id] = time.Now()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.channels, id)
	}
}

// Run dials the guest, makes the key pairs, serves the socket and returns
// when ctx ends or the held connection does, removing its socket and key
// files. A stale socket (a holder that died) is replaced; a file there
// that is no socket is an error.
func (h *Holder) Run(ctx context.Context) error {
	first, err := h.Dial(ctx)
	if err != nil {
		return fmt.Errorf("connecting to the guest: %w", err)
	}
	g := &guests{conns: []*ssh.Client{first}, dial: h.Dial, log: h.Log, own: &h.own}
	g.note()
	defer g.closeAll()
	// The socket first: a live holder there is left alone, keys and all.
	// A caller that reads the keys before they are new fails its
	// handshake and dials the guest directly.
	ln, err := h.listen()
	if err != nil {
		return err
	}
	defer ln.Close() // removes the socket
	cfg, err := h.makeKeys()
	if err != nil {
		return err
	}
	defer os.Remove(h.Files.Key)
	defer os.Remove(h.Files.HostKey)
	h.Log.Info("holding a connection to the guest", "socket", h.Files.Socket, "guest", first.RemoteAddr().String())

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		cancel(fmt.Errorf("the connection to the guest ended: %v", first.Wait()))
	}()
	go h.keepalive(ctx, first, cancel)
	if h.Watch != nil {
		go h.Watch(ctx, first)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	ds := &reverseForwards{log: h.Log}
	defer ds.closeAll()
	reopen := func() error {
		if h.ReverseForwards == nil {
			return nil
		}
		want, err := h.ReverseForwards()
		if err != nil {
			return err
		}
		return ds.apply(ctx, first, want)
	}
	if err := reopen(); err != nil {
		h.Log.Warn("a reverse forward did not open", "error", err)
	}

	var callers sync.WaitGroup
	defer callers.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				cause := context.Cause(ctx)
				if errors.Is(cause, context.Canceled) {
					h.Log.Info("stopping")
					return nil
				}
				h.Log.Info("ending", "reason", cause)
				return nil
			}
			return fmt.Errorf("accepting on %s: %w", h.Files.Socket, err)
		}
		callers.Add(1)
		go func() {
			defer callers.Done()
			h.serve(ctx, conn.(*net.UnixConn), cfg, g, reopen)
		}()
	}
}

// makeKeys makes the holder's host key (kept in memory) and the callers'
// key (written to Files.Key, 0600), and pins the host key in
// Files.HostKey.
func (h *Holder) makeKeys() (*ssh.ServerConfig, error) {
	host, err := sshkeys.Generate("agent-vm holder")
	if err != nil {
		return nil, err
	}
	hostSigner, err := ssh.ParsePrivateKey(host.PrivatePEM)
	if err != nil {
		return nil, err
	}
	caller, err := sshkeys.Generate("agent-vm holder caller")
	if err != nil {
		return nil, err
	}
	want := caller.Public.Marshal()
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			if subtle.ConstantTimeCompare(k.Marshal(), want) == 1 {
				return nil, nil
			}
			return nil, errors.New("not the holder's caller key")
		},
		MaxAuthTries: 3,
	}
	cfg.AddHostKey(hostSigner)
	if err := atomicfile.Write(h.Files.Key, caller.PrivatePEM, 0o600); err != nil {
		return nil, fmt.Errorf("writing the callers' key: %w", err)
	}
	if err := atomicfile.Write(h.Files.HostKey, host.AuthorizedKey, 0o600); err != nil {
		return nil, fmt.Errorf("writing the holder's host key: %w", err)
	}
	return cfg, nil
}

// listen makes the socket, 0600 in its 0700 directory (so it is no one
// else's between bind and chmod), replacing a stale one.
func (h *Holder) listen() (*net.UnixListener, error) {
	sock := h.Files.Socket
	if err := sockdir.Ensure(filepath.Dir(sock), h.RunDir); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Dir(sock), 0o700); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(sock); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s is in the way of the holder's socket and is no socket (hint: remove it)", sock)
		}
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return nil, fmt.Errorf("another holder serves %s (hint: `agent-vm stop` ends it with the VM)", sock)
		}
		if err := os.Remove(sock); err != nil {
			return nil, fmt.Errorf("removing the stale socket %s: %w", sock, err)
		}
	}
	return sockdir.Listen(sock, 0o600)
}

// serve runs one caller's connection: its uid must be ours or root's, then
// the SSH handshake, then a proxied channel for each it opens.
func (h *Holder) serve(ctx context.Context, conn *net.UnixConn, cfg *ssh.ServerConfig, g *guests, reopen func() error) {
	defer conn.Close()
	if err := peerAllowed(conn); err != nil {
		h.Log.Warn("refused a caller", "error", err)
		return
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	sc, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		h.Log.Debug("a caller's handshake failed", "error", err)
		return
	}
	_ = conn.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { sc.Close() })
	defer stop()
	go answer(reqs, reopen, h.Log)
	var wg sync.WaitGroup
	for nc := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if nc.ChannelType() == NoticesChannel {
				if h.Notices == nil {
					_ = nc.Reject(ssh.UnknownChannelType, "this holder passes no notices")
					return
				}
				h.Notices.listen(nc)
				return
			}
			defer h.relaying()()
			proxyChannel(nc, g.open)
		}()
	}
	wg.Wait()
}

// peerAllowed accepts a caller running as the holder's user or as root.
func peerAllowed(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("reading the caller's credentials: %w", cerr)
	}
	if int(cred.Uid) != os.Geteuid() && cred.Uid != 0 {
		return fmt.Errorf("caller pid %d runs as uid %d, not the VM's owner", cred.Pid, cred.Uid)
	}
	return nil
}

// keepalive ends the holder (cancel) when the guest leaves three
// keepalives in a row unanswered.
func (h *Holder) keepalive(ctx context.Context, c *ssh.Client, cancel context.CancelCauseFunc) {
	every := h.Keepalive
	if every == 0 {
		every = 15 * time.Second
	}
	if err := sshx.Keepalive(ctx, c, every, 3, h.Asleep); err != nil {
		cancel(fmt.Errorf("the guest connection: %w", err))
	}
}

// guests are the connections to the guest: the held one first, and more
// when the guest caps the channels of one (sshd's MaxSessions).
type guests struct {
	mu     sync.Mutex
	dialMu sync.Mutex
	conns  []*ssh.Client
	dial   func(ctx context.Context) (*ssh.Client, error)
	log    hclog.Logger
	own    *atomic.Pointer[[]string] // conns' local ends, for Holder.InUse
}

// note keeps the local ends of conns (g.mu held, or before any sharing).
func (g *guests) note() {
	ends := make([]string, 0, len(g.conns))
	for _, c := range g.conns {
		ends = append(ends, c.LocalAddr().String())
	}
	g.own.Store(&ends)
}

// open opens a channel on the first connection that takes it. When all
// refuse a session (OpenSSH refuses one over MaxSessions as "open failed"),
// one more connection is dialed (one dial at a time, and at most a few per
// channel) and kept for later channels until it ends.
func (g *guests) open(kind string, extra []byte) (ssh.Channel, <-chan *ssh.Request, error) {
	for tries := 0; ; tries++ {
		g.mu.Lock()
		conns := append([]*ssh.Client(nil), g.conns...)
		g.mu.Unlock()
		var refused error
		for _, c := range conns {
			ch, reqs, err := c.OpenChannel(kind, extra)
			if err == nil {
				return ch, reqs, nil
			}
			if refused = err; kind != "session" || !isRefusal(err) {
				return nil, nil, err
			}
		}
		if tries == 3 {
			return nil, nil, refused
		}
		if err := g.more(len(conns)); err != nil {
			return nil, nil, errors.Join(refused, fmt.Errorf("another connection to the guest: %w", err))
		}
	}
}

// more dials one more connection unless another caller did since there
// were seen.
func (g *guests) more(seen int) error {
	g.dialMu.Lock()
	defer g.dialMu.Unlock()
	g.mu.Lock()
	n := len(g.conns)
	g.mu.Unlock()
	if n != seen {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := g.dial(ctx)
	if err != nil {
		return err
	}
	g.log.Info("the guest capped the sessions of its connections; opened another", "connections", n+1)
	g.mu.Lock()
	g.conns = append(g.conns, c)
	g.note()
	g.mu.Unlock()
	go func() {
		_ = c.Wait()
		g.mu.Lock()
		defer g.mu.Unlock()
		g.conns = slices.DeleteFunc(g.conns, func(x *ssh.Client) bool { return x == c })
		g.note()
	}()
	return nil
}

// isRefusal reports a channel the guest refused (rather than a failed
// connection).
func isRefusal(err error) bool {
	var oce *ssh.OpenChannelError
	return errors.As(err, &oce)
}

func (g *guests) closeAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		c.Close()
	}
}

// answer replies to a caller's global requests: ReloadRequest reopens the
// reverse forwards; any other (tcpip-forward among them) fails.
func answer(reqs <-chan *ssh.Request, reopen func() error, log hclog.Logger) {
	for req := range reqs {
		if req.Type != ReloadRequest {
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
			continue
		}
		err := reopen()
		if err != nil {
			log.Warn("a reverse forward did not open", "error", err)
			_ = req.Reply(false, []byte(err.Error()))
			continue
		}
		_ = req.Reply(true, nil)
	}
}
