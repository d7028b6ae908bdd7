package hold

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// greeter is a reverse forward's host end: it answers each line with "hello " and
// the line, and counts the connections it served.
func greeter(served *atomic.Int32) func(context.Context, net.Conn) {
	return func(_ context.Context, c net.Conn) {
		defer c.Close()
		served.Add(1)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("hello " + line))
	}
}

// ask is a guest program using a reverse forward: it connects, says name and
// reads the answer.
func ask(t *testing.T, network, addr, name string) string {
	t.Helper()
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		t.Fatalf("the guest's %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(name + "\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the reverse forward's answer at %s: %v", addr, err)
	}
	return strings.TrimSpace(line)
}

// The real sshd stands for the guest's: it listens at the socket and port the
// holder asks for, and every connection made there is served by the reverse
// forward's Serve in the holder; several at once; a reload closes the reverse
// forwards no longer wanted.
func TestReverseForwardsCarryGuestSocketsAndPortsToTheHolder(t *testing.T) {
	s := guestSSHD(t)
	guestDir := filepath.Join(t.TempDir(), "bridge")
	sock := filepath.Join(guestDir, "agent-vm.sock")
	port := testutil.FreePort(t)
	var sockServed, portServed atomic.Int32
	var open atomic.Bool
	open.Store(true)
	forwards := func() ([]ReverseForward, error) {
		if !open.Load() {
			return nil, nil
		}
		return []ReverseForward{
			{Name: "socket", GuestSocket: sock, Prepare: "mkdir -p -m 0700 " + guestDir + " && rm -f " + sock, Serve: greeter(&sockServed)},
			{Name: "port", GuestPort: port, Serve: greeter(&portServed)},
		}, nil
	}
	// A stale socket (a holder before this one) is in the way: Prepare
	// removes it.
	if err := os.MkdirAll(guestDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f := runHolderWith(t, s, forwards)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := testutil.Poll(ctx, "the reverse forward's socket "+sock, func() bool { fi, err := os.Stat(sock); return err == nil && fi.Mode().Type() == os.ModeSocket }); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(sock)
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("the guest's socket is mode %o, want no access for group or others", perm)
	}

	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "client" + strconv.Itoa(i)
			if got := ask(t, "unix", sock, name); got != "hello "+name {
				t.Errorf("socket forward answered %q, want %q", got, "hello "+name)
			}
			if got := ask(t, "tcp", "127.0.0.1:"+strconv.Itoa(port), name); got != "hello "+name {
				t.Errorf("port forward answered %q", got)
			}
		}()
	}
	wg.Wait()
	if sockServed.Load() != 4 || portServed.Load() != 4 {
		t.Errorf("served %d socket and %d port connections, want 4 each", sockServed.Load(), portServed.Load())
	}

	open.Store(false)
	if err := Reload(context.Background(), f, s.User); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 2*time.Second); err == nil {
		c.Close()
		t.Errorf("the port forward still accepts after a reload closed it")
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the closed reverse forward's socket is still in the guest (%v): a guest program would find it and reach nothing", err)
	}
}

// A reverse forward that cannot open is the reload's error, in words naming it,
// and the others still open.
func TestReloadSaysWhichReverseForwardFailed(t *testing.T) {
	s := guestSSHD(t)
	var served atomic.Int32
	port := testutil.FreePort(t)
	forwards := func() ([]ReverseForward, error) {
		return []ReverseForward{
			{Name: "broken", GuestSocket: "/nonexistent-dir/x.sock", Serve: greeter(&served)},
			{Name: "port", GuestPort: port, Serve: greeter(&served)},
		}, nil
	}
	f := runHolderWith(t, s, forwards)
	err := Reload(context.Background(), f, s.User)
	if err == nil || !strings.Contains(err.Error(), "opening the broken reverse forward at the guest's /nonexistent-dir/x.sock") {
		t.Fatalf("Reload = %v, want the broken reverse forward named", err)
	}
	if got := ask(t, "tcp", "127.0.0.1:"+strconv.Itoa(port), "x"); got != "hello x" {
		t.Errorf("the good reverse forward answered %q", got)
	}
}

// A caller listening on a notices channel hears each line the holder's
// reverse forwards send while it listens; a caller connected directly to
// the guest cannot open one (the guest's sshd refuses the type).
func TestNoticesReachTheCallersListening(t *testing.T) {
	s := guestSSHD(t)
	notices := NewNotices()
	dir := t.TempDir()
	h := &Holder{Files: FilesFor(dir, testUUID), RunDir: dir, Log: testLogger(t), Notices: notices,
		Dial: func(ctx context.Context) (*ssh.Client, error) { return sshx.WaitReady(ctx, targetOf(s), nil) }}
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() { _ = h.Run(ctx); close(ended) }()
	t.Cleanup(func() { cancel(); <-ended })
	waitServing(t, h.Files, s.User, ended)
	c := dialHolder(t, h.Files, s)
	ch, reqs, err := c.OpenChannel(NoticesChannel, nil)
	if err != nil {
		t.Fatal(err)
	}
	go ssh.DiscardRequests(reqs)
	r := bufio.NewReader(ch)
	for _, want := range []string{"agent-vm: VM feat asks to open https://example.test/", "second"} {
		// Send until heard: the holder registers the listener just after
		// accepting the channel.
		got := make(chan string, 1)
		go func() { line, _ := r.ReadString('\n'); got <- line }()
		deadline := time.After(10 * time.Second)
	wait:
		for {
			notices.Send(want)
			select {
			case line := <-got:
				if strings.TrimSpace(line) != want {
					t.Fatalf("heard %q, want %q", line, want)
				}
				break wait
			case <-deadline:
				t.Fatalf("never heard %q", want)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	direct, err := sshx.WaitReady(context.Background(), targetOf(s), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, _, err := direct.OpenChannel(NoticesChannel, nil); err == nil {
		t.Error("the guest's sshd accepted a notices channel")
	}
}
