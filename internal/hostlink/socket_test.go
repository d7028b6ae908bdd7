package hostlink

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// A forwarded socket, for real: a socket made on the "host" (this machine's sshd,
// reached through the link) whose connections come back to a server here, given
// to another user; a stale socket in its place is replaced; when the sshd
// restarts, the forwarded socket is made again; ctx's end ends it.
func TestServeSocket(t *testing.T) {
	srv, _, target := tunnelTo(t)
	tun, err := NewTunnel(target)
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	here := echoServer(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "8080")
	if err := os.WriteFile(sock, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{}, 4)
	done := make(chan error, 1)
	go func() {
		done <- tun.ServeSocket(ctx, sock, "65534:65534", func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", here)
		}, func() { ready <- struct{}{} })
	}()
	waitReady := func(what string) {
		t.Helper()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("%s: the forwarded socket ended: %v", what, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the forwarded socket was not made within 20s", what)
		}
	}
	waitReady("first")
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the forwarded socket %s: %v, %v; want a socket", sock, fi, err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 || st.Gid != 65534 || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("the forwarded socket is %d:%d %v, want 65534:65534 and no access for others", st.Uid, st.Gid, fi.Mode().Perm())
	}
	through := func(line string) error {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return err
		}
		return echo(c, line)
	}
	if err := through("one\n"); err != nil {
		t.Fatalf("through the forwarded socket: %v", err)
	}

	srv.Stop()
	srv.Start()
	waitReady("after the sshd restarted")
	var last error
	pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer pcancel()
	i := 0
	if err := tu.Poll(pctx, "the socket made again to carry a line", func() bool {
		i++
		last = through("two " + strconv.Itoa(i) + "\n")
		return last == nil
	}); err != nil {
		t.Fatalf("%v: %v", err, last)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the forwarded socket ended with %v, want nil at ctx's end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the forwarded socket did not end with its ctx")
	}
}
