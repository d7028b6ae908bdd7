package hostlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
)

// echoServer echoes every connection on 127.0.0.1 until the test ends;
// it stands for a guest's service, reached from the "host".
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

// echo sends a line through conn and checks it comes back.
func echo(conn net.Conn, line string) error {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, line); err != nil {
		return err
	}
	got := make([]byte, len(line))
	if _, err := io.ReadFull(conn, got); err != nil {
		return err
	}
	if string(got) != line {
		return fmt.Errorf("echoed %q, want %q", got, line)
	}
	return nil
}

// relay stands between the Tunnel and the sshd, as a network does: it
// counts the connections made through it, and can go silent (carry no
// more bytes and close nothing, as a link to a host that vanished).
type relay struct {
	Addr     string
	accepted atomic.Int32
	silent   atomic.Bool
}

func newRelay(t *testing.T, to string) *relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	r := &relay{Addr: l.Addr().String()}
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !r.silent.Load() {
				if _, err := dst.Write(buf[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.accepted.Add(1)
			up, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return r
}

// tunnelTo starts an sshd and a relay to it, and returns them with a
// Target reaching the sshd through the relay, its key and pin copied to
// files of the test's own (which the test may remove).
func tunnelTo(t *testing.T) (*sshdtest.Server, *relay, Target) {
	t.Helper()
	srv := sshdtest.New(t)
	srv.Start()
	r := newRelay(t, srv.Addr)
	dir := t.TempDir()
	key, err := os.ReadFile(srv.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	target := Target{Addr: r.Addr, User: srv.User, KeyFile: filepath.Join(dir, "key"), KnownHosts: filepath.Join(dir, "known_hosts")}
	if err := os.WriteFile(target.KeyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target.KnownHosts, []byte(PinLine(r.Addr, srv.HostKey.Public)), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, r, target
}

// A Tunnel reads its key and pin once: with both files gone it carries
// connections to the host's side, concurrent Dials over one SSH
// connection; a port nothing listens at is refused naming it, and the
// link stays; after the sshd is stopped and started again (same port,
// same host key) the next Dial makes a new link and works, as it does when
// the held link ended unseen; Close ends it.
func TestTunnel(t *testing.T) {
	srv, r, target := tunnelTo(t)
	ctx := context.Background()
	tun, err := NewTunnel(target)
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	os.Remove(target.KeyFile)
	os.Remove(target.KnownHosts)
	echoAddr := echoServer(t)

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := tun.Dial(ctx, echoAddr)
			if err == nil {
				err = echo(conn, strings.Repeat(fmt.Sprint(i), 1000+i))
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := r.accepted.Load(); n != 1 {
		t.Errorf("8 Dials made %d SSH connections, want 1 shared", n)
	}

	if _, err := tun.Dial(ctx, "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") || !strings.Contains(err.Error(), "AllowTcpForwarding") {
		t.Errorf("a port nothing listens at: %v", err)
	}
	conn, err := tun.Dial(ctx, echoAddr)
	if err == nil {
		err = echo(conn, "still here")
	}
	if err != nil || r.accepted.Load() != 1 {
		t.Errorf("after a refused channel: %v, %d SSH connections, want the one", err, r.accepted.Load())
	}

	// One connection stays open across the restart: it ends with the link.
	open, err := tun.Dial(ctx, echoAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	srv.Stop()
	if _, err := tun.Dial(ctx, echoAddr); err == nil || !strings.Contains(err.Error(), r.Addr) {
		t.Errorf("with the sshd stopped: %v, want an error naming %s", err, r.Addr)
	}
	_ = open.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := open.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("a connection the stopped link carried reads %v, want EOF", err)
	}
	srv.Start()
	before := r.accepted.Load()
	conn, err = tun.Dial(ctx, echoAddr)
	if err == nil {
		err = echo(conn, "again")
	}
	if err != nil || r.accepted.Load() != before+1 {
		t.Errorf("after the sshd's restart: %v, %d new SSH connections, want 1", err, r.accepted.Load()-before)
	}

	// A held link that ended before its end was seen (Wait has not
	// returned): the channel cannot open, and the Dial makes a new link.
	tun.mu.Lock()
	stale := &heldLink{c: tun.held.c, dead: make(chan struct{})}
	tun.held = stale
	tun.mu.Unlock()
	stale.c.Close()
	before = r.accepted.Load()
	conn, err = tun.Dial(ctx, echoAddr)
	if err == nil {
		err = echo(conn, "once more")
	}
	if err != nil || r.accepted.Load() != before+1 {
		t.Errorf("after the held link ended unseen: %v, %d new SSH connections, want 1", err, r.accepted.Load()-before)
	}

	tun.Close()
	if _, err := tun.Dial(ctx, echoAddr); !errors.Is(err, ErrTunnelClosed) {
		t.Errorf("after Close: %v, want ErrTunnelClosed", err)
	}
}

// A held link that went silent is noticed by its keepalives and closed,
// and the next Dial makes a new one.
func TestTunnelKeepalive(t *testing.T) {
	_, r, target := tunnelTo(t)
	tun, err := NewTunnel(target)
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	tun.every = 50 * time.Millisecond
	echoAddr := echoServer(t)
	ctx := context.Background()
	conn, err := tun.Dial(ctx, echoAddr)
	if err == nil {
		err = echo(conn, "hello")
	}
	if err != nil {
		t.Fatal(err)
	}
	tun.mu.Lock()
	held := tun.held
	tun.mu.Unlock()
	r.silent.Store(true)
	select {
	case <-held.dead:
	case <-time.After(30 * time.Second):
		t.Fatal("the silent link was never closed")
	}
	r.silent.Store(false)
	conn, err = tun.Dial(ctx, echoAddr)
	if err == nil {
		err = echo(conn, "hello again")
	}
	if err != nil || r.accepted.Load() != 2 {
		t.Errorf("after the silent link: %v, %d SSH connections in all, want 2", err, r.accepted.Load())
	}
}

// A host key other than the pinned one is refused with what to do, and
// never tried again: neither by the Dial that met it nor by later ones.
// A key file that is not there fails NewTunnel naming it and the host.
func TestTunnelRefusals(t *testing.T) {
	_, r, target := tunnelTo(t)
	other, _ := sshkeys.Generate("another host")
	if err := os.WriteFile(target.KnownHosts, []byte(PinLine(r.Addr, other.Public)), 0o600); err != nil {
		t.Fatal(err)
	}
	tun, err := NewTunnel(target)
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	echoAddr := echoServer(t)
	for i := range 2 {
		_, err := tun.Dial(context.Background(), echoAddr)
		if !errors.Is(err, sshx.ErrHostKeyMismatch) || !strings.Contains(err.Error(), "other than the one pinned") || !strings.Contains(err.Error(), r.Addr) {
			t.Errorf("Dial %d with another host key pinned: %v", i, err)
		}
	}
	if n := r.accepted.Load(); n != 1 {
		t.Errorf("a host key mismatch was tried %d times, want once", n)
	}

	target.KeyFile = filepath.Join(t.TempDir(), "gone")
	if _, err := NewTunnel(target); err == nil || !strings.Contains(err.Error(), target.KeyFile) || !strings.Contains(err.Error(), r.Addr) {
		t.Errorf("NewTunnel without its key: %v", err)
	}
}
