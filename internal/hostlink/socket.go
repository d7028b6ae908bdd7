package hostlink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/tcpfwd"
)

// A forwarded socket is the other way: a unix socket on the host whose
// connections come back through the link to this machine. It is how a VM placed
// on a host reaches a port the user exposed on this machine's 127.0.0.1 (`port
// expose`): the VM's egress proxy on the host connects to the forwarded socket,
// never to the host's own 127.0.0.1, and nothing listens on the host beyond that
// socket.

// SocketReadyLine is the line a program serving the forwarded socket sock prints
// once the socket is made on the host (net-forward, for the driver that waits for
// it).
func SocketReadyLine(sock string) string { return "socket " + sock + " ready" }

// socketRetry is how long ServeSocket waits before making the link again.
const socketRetry = 2 * time.Second

// ServeSocket makes the unix socket sock on the host through the link
// (OpenSSH's streamlocal-forward: sshd makes it, 0600 to the login user),
// gives it to owner ("UID:GID"; "" leaves it the login user's) so a
// program that dropped to that user (the egress proxy) may connect, and
// carries each connection made there to what dial opens on this machine.
// A socket left by an earlier run is removed first (sshd will not bind
// over it). When the link drops the socket is made again on a new one,
// every socketRetry, until ctx ends (then nil) or the host's key is not the
// pinned one (then that error). ready, if set, is called each time the
// socket is made and given.
func (t *Tunnel) ServeSocket(ctx context.Context, sock, owner string, dial func(context.Context) (net.Conn, error), ready func()) error {
	if !path.IsAbs(sock) {
		return fmt.Errorf("internal error: forwarded socket %q is not an absolute path", sock)
	}
	for {
		l, _, err := t.link(ctx)
		if err == nil {
			err = t.serveSocketOn(ctx, l, sock, owner, dial, ready)
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrTunnelClosed) || t.isRefused() {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(socketRetry):
		}
	}
}

func (t *Tunnel) isRefused() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.refused != nil
}

// serveSocketOn serves the forwarded socket on one held connection until it ends.
func (t *Tunnel) serveSocketOn(ctx context.Context, l *heldLink, sock, owner string, dial func(context.Context) (net.Conn, error), ready func()) error {
	run := Runner{C: l.c}
	if _, err := run.Run(ctx, execx.Cmd{Path: "rm", Args: []string{"-f", "--", sock}}); err != nil {
		return fmt.Errorf("removing the old forwarded socket %s on %s: %w", sock, t.target.Addr, err)
	}
	ln, err := l.c.ListenUnix(sock)
	if err != nil {
		return fmt.Errorf("making the forwarded socket %s on %s: %w (hint: does the host's sshd allow it, AllowStreamLocalForwarding?)", sock, t.target.Addr, err)
	}
	defer ln.Close()
	if owner != "" {
		if _, err := run.Run(ctx, execx.Cmd{Path: "chown", Args: []string{"--", owner, sock}}); err != nil {
			return fmt.Errorf("giving the forwarded socket %s on %s to %s: %w", sock, t.target.Addr, owner, err)
		}
	}
	if ready != nil {
		ready()
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	go func() {
		<-l.dead
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			up, err := dial(ctx)
			if err != nil {
				return
			}
			defer up.Close()
			tcpfwd.Splice(c, up)
		}()
	}
}
