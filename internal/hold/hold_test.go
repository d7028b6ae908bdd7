package hold

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
)

// The holder under test is real, and so is the guest: an OpenSSH sshd on
// 127.0.0.1 (sshdtest) stands in for the guest's.

const testUUID = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"

func testLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: testWriter{t}})
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func targetOf(s *sshdtest.Server) sshx.Target {
	return sshx.Target{Addr: s.Addr, User: s.User, KeyFile: s.KeyFile, KnownHosts: s.KnownHosts}
}

// guestSSHD starts the stand-in guest, accepting AGENTVM_* variables.
func guestSSHD(t *testing.T) *sshdtest.Server {
	s := sshdtest.New(t)
	s.AcceptEnv = "AGENTVM_*"
	s.Start()
	return s
}

// runHolder runs a holder for s in this process until the test ends and
// returns its files once it serves.
func runHolder(t *testing.T, s *sshdtest.Server) Files {
	t.Helper()
	return runHolderWith(t, s, nil)
}

// runHolderWith is runHolder with the holder's reverse forwards.
func runHolderWith(t *testing.T, s *sshdtest.Server, forwards func() ([]ReverseForward, error)) Files {
	t.Helper()
	return startHolder(t, s, forwards).Files
}

// startHolder is runHolderWith's holder.
func startHolder(t *testing.T, s *sshdtest.Server, forwards func() ([]ReverseForward, error)) *Holder {
	t.Helper()
	dir := t.TempDir()
	h := &Holder{Files: FilesFor(dir, testUUID), RunDir: dir, Log: testLogger(t), ReverseForwards: forwards,
		Dial: func(ctx context.Context) (*ssh.Client, error) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return sshx.WaitReady(ctx, targetOf(s), nil)
		}}
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	ended := make(chan struct{})
	go func() { runErr = h.Run(ctx); close(ended) }()
	t.Cleanup(func() {
		cancel()
		<-ended
		if runErr != nil {
			t.Errorf("holder: %v", runErr)
		}
	})
	waitServing(t, h.Files, s.User, ended)
	return h
}

// waitServing waits until a caller gets through to the holder of f.
func waitServing(t *testing.T, f Files, user string, ended <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := Dial(context.Background(), f, user, 5*time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-ended:
			t.Fatalf("the holder ended before serving (its log says why)")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holder does not serve %s: %v", f.Socket, err)
		}
	}
}

func dialHolder(t *testing.T, f Files, s *sshdtest.Server) *ssh.Client {
	t.Helper()
	c, err := Dial(context.Background(), f, s.User, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if c.RemoteAddr().Network() != "unix" {
		t.Fatalf("connected over %s, want the holder's unix socket", c.RemoteAddr().Network())
	}
	return c
}

func TestExecStatusAndStreams(t *testing.T) {
	s := guestSSHD(t)
	c := dialHolder(t, runHolder(t, s), s)
	ctx := context.Background()
	for _, want := range []int{0, 1, 7, 255} {
		var out, errOut bytes.Buffer
		code, err := sshx.Run(ctx, c, fmt.Sprintf("echo out; echo err >&2; exit %d", want), nil, &out, &errOut)
		if err != nil || code != want || out.String() != "out\n" || errOut.String() != "err\n" {
			t.Errorf("exit %d: got code %d err %v stdout %q stderr %q", want, code, err, out.String(), errOut.String())
		}
	}
	var out bytes.Buffer
	code, err := sshx.Run(ctx, c, "tr a-z A-Z", strings.NewReader("piped in"), &out, io.Discard)
	if err != nil || code != 0 || out.String() != "PIPED IN" {
		t.Errorf("stdin: got %d %v %q, want PIPED IN", code, err, out.String())
	}
}

func TestLargeTransfersAreByteExact(t *testing.T) {
	s := guestSSHD(t)
	c := dialHolder(t, runHolder(t, s), s)
	data := make([]byte, 24<<20+123)
	rand.Read(data)
	want := sha256.Sum256(data)
	// There and back on stdout, then back on stderr.
	for _, cmd := range []string{"cat", "cat >&2"} {
		var out, errOut bytes.Buffer
		code, err := sshx.Run(context.Background(), c, cmd, bytes.NewReader(data), &out, &errOut)
		got := out.Bytes()
		if cmd != "cat" {
			got = errOut.Bytes()
		}
		if err != nil || code != 0 || sha256.Sum256(got) != want {
			t.Errorf("%s: code %d err %v, %d bytes back of %d, same: %v", cmd, code, err, len(got), len(data), sha256.Sum256(got) == want)
		}
	}
}

// heldSession is a session through a holder of a new guest sshd.
func heldSession(t *testing.T) *ssh.Session {
	t.Helper()
	s := guestSSHD(t)
	c := dialHolder(t, runHolder(t, s), s)
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	return sess
}

func TestPTYAndWindowChange(t *testing.T) {
	sess := heldSession(t)
	if err := sess.RequestPty("xterm", 24, 80, ssh.TerminalModes{ssh.ECHO: 0}); err != nil {
		t.Fatal(err)
	}
	in, _ := sess.StdinPipe()
	out, _ := sess.StdoutPipe()
	// The window change is a channel request and "go" is channel data: the
	// holder relays the two on separate paths (relay's doc), so the guest
	// may read "go" first; it waits up to 10 s for the new size to land.
	if err := sess.Start(`tty >/dev/null && echo is-a-tty; stty size; read x; i=0; while [ "$(stty size)" != "30 100" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; stty size`); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	expect := func(want string) {
		t.Helper()
		for {
			line, err := r.ReadString('\n')
			if strings.TrimSpace(line) == want {
				return
			}
			if err != nil {
				t.Fatalf("waiting for %q: %v", want, err)
			}
		}
	}
	expect("is-a-tty")
	expect("24 80")
	if err := sess.WindowChange(30, 100); err != nil {
		t.Fatal(err)
	}
	io.WriteString(in, "go\n")
	expect("30 100")
	if err := sess.Wait(); err != nil {
		t.Errorf("pty session: %v", err)
	}
}

func TestSignalsAndExitSignal(t *testing.T) {
	s := sshdtest.New(t)
	s.User = sshdtest.OtherUser(t) // a guest's user: sshd refuses a root session's signals
	s.Start()
	c := dialHolder(t, runHolder(t, s), s)
	run := func(cmd string, sig ssh.Signal) (string, error) {
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		out, _ := sess.StdoutPipe()
		if err := sess.Start(cmd); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(out)
		if line, _ := r.ReadString('\n'); line != "ready\n" {
			t.Fatalf("got %q, want ready", line)
		}
		if err := sess.Signal(sig); err != nil {
			t.Fatal(err)
		}
		rest, _ := io.ReadAll(r)
		return string(rest), sess.Wait()
	}
	out, err := run(`trap 'echo got USR1; exit 3' USR1; echo ready; while :; do sleep 0.1; done`, ssh.SIGUSR1)
	var ee *ssh.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 3 || out != "got USR1\n" {
		t.Errorf("USR1: got %v, output %q; want exit 3 and got USR1", err, out)
	}
	_, err = run(`echo ready; exec sleep 60`, ssh.SIGKILL)
	if !errors.As(err, &ee) || ee.Signal() != "KILL" {
		t.Errorf("KILL: got %v, want an exit-signal KILL", err)
	}
}

func TestEnvRequestsAndTheirRefusals(t *testing.T) {
	sess := heldSession(t)
	if err := sess.Setenv("AGENTVM_X", "from the caller"); err != nil {
		t.Errorf("an accepted variable: %v", err)
	}
	if err := sess.Setenv("NOT_ACCEPTED", "x"); err == nil {
		t.Error("the guest's refusal of a variable was not passed on")
	}
	out, err := sess.Output(`printf %s "$AGENTVM_X|$NOT_ACCEPTED"`)
	if err != nil || string(out) != "from the caller|" {
		t.Errorf("got %q %v", out, err)
	}
}

func TestDirectTCPIPForwards(t *testing.T) {
	s := guestSSHD(t)
	c := dialHolder(t, runHolder(t, s), s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(conn, conn); conn.Close() }()
		}
	}()
	conn, err := c.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "echo me")
	buf := make([]byte, 7)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "echo me" {
		t.Errorf("forward: got %q %v", buf, err)
	}
	conn.Close()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := closed.Addr().String()
	closed.Close()
	var oce *ssh.OpenChannelError
	if _, err := c.Dial("tcp", addr); !errors.As(err, &oce) || oce.Reason != ssh.ConnectionFailed {
		t.Errorf("a forward to a closed port: got %v, want the guest's connect failure", err)
	}
}

func TestManyConcurrentSessions(t *testing.T) {
	s := guestSSHD(t)
	f := runHolder(t, s)
	// More than sshd's 10 sessions per connection, from several callers.
	const n = 24
	clients := []*ssh.Client{dialHolder(t, f, s), dialHolder(t, f, s), dialHolder(t, f, s)}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			code, err := sshx.Run(context.Background(), clients[i%len(clients)], fmt.Sprintf("sleep 1; echo %d", i), nil, &out, io.Discard)
			if err != nil || code != 0 || out.String() != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("session %d: code %d err %v out %q", i, code, err, out.String())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestOnlyTheOwnerWithTheKeyGetsIn(t *testing.T) {
	s := guestSSHD(t)
	f := runHolder(t, s)
	for path, want := range map[string]os.FileMode{f.Socket: os.ModeSocket | 0o600, filepath.Dir(f.Socket): os.ModeDir | 0o700,
		f.Key: 0o600, f.HostKey: 0o600} {
		if fi, err := os.Lstat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode(), err, want)
		}
	}
	// Another key: refused.
	other, _ := sshkeys.Generate("intruder")
	dir := t.TempDir()
	wrongKey := f
	wrongKey.Key = filepath.Join(dir, "key")
	other.Write(wrongKey.Key)
	if _, err := Dial(context.Background(), wrongKey, s.User, 5*time.Second); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("a caller with another key: got %v, want refused", err)
	}
	// Another host key pinned: the caller refuses the holder.
	wrongHost := f
	wrongHost.HostKey = filepath.Join(dir, "host.pub")
	os.WriteFile(wrongHost.HostKey, other.AuthorizedKey, 0o600)
	if _, err := Dial(context.Background(), wrongHost, s.User, 5*time.Second); err == nil || !strings.Contains(err.Error(), "host key") {
		t.Errorf("another pinned host key: got %v, want a host key mismatch", err)
	}
	// The user's own key to the guest is no key to the holder either.
	guestKey := f
	guestKey.Key = s.KeyFile
	if _, err := Dial(context.Background(), guestKey, s.User, 5*time.Second); err == nil {
		t.Error("the guest's client key was accepted by the holder")
	}
}

// InUse counts the callers' channels relayed for at least the age asked
// (a quick look at the sessions is not a client), and names the local
// ends of the connections held.
func TestInUse(t *testing.T) {
	h := &Holder{}
	h.own.Store(&[]string{"127.0.0.1:40001", "127.0.0.1:40002"})
	done1, done2 := h.relaying(), h.relaying()
	if ch, own := h.InUse(0); ch != 2 || len(own) != 2 || own[1] != "127.0.0.1:40002" {
		t.Errorf("InUse(0) = %d channels, connections from %q; want 2, the two held", ch, own)
	}
	if ch, _ := h.InUse(time.Hour); ch != 0 {
		t.Errorf("InUse(1h) = %d channels, want none open that long", ch)
	}
	done1()
	done2()
	if ch, _ := h.InUse(0); ch != 0 {
		t.Errorf("after both ended: %d channels", ch)
	}
}

// A running holder's own ends are those of its real connection to the
// guest's sshd: the kernel's table has an established connection from
// there to the sshd's address.
func TestInUseNamesTheHeldConnection(t *testing.T) {
	s := guestSSHD(t)
	h := startHolder(t, s, nil)
	_, own := h.InUse(0)
	if len(own) != 1 {
		t.Fatalf("the holder's own ends: %q, want the held connection's", own)
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatalf("the kernel's TCP table to check against: %v", err)
	}
	hexEnd := func(addr string) string {
		ap := netip.MustParseAddrPort(addr)
		ip := ap.Addr().As4()
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], ap.Port())
	}
	want := hexEnd(own[0]) + " " + hexEnd(s.Addr) + " 01"
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 3 && strings.Join(f[1:4], " ") == want {
			found = true
		}
	}
	if !found {
		t.Errorf("no established connection %s -> %s in /proc/net/tcp", own[0], s.Addr)
	}
}

// A command that ends at once: the guest's sshd answers exec, sends
// exit-status and closes the channel in the same breath. The holder
// passes the answer on on one goroutine and the close on another; with
// the answer held back (as a busy host's scheduler may), the close must
// still not overtake it, or the caller's exec is left unanswered.
func TestAQuickCommandsExitStatusOutrunsNothing(t *testing.T) {
	beforeReply = func(req string) {
		if req == "exec" {
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Cleanup(func() { beforeReply = func(string) {} })
	s := guestSSHD(t)
	c := dialHolder(t, runHolder(t, s), s)
	for i := range 10 {
		if code, err := sshx.Run(context.Background(), c, "exit 3", nil, io.Discard, io.Discard); err != nil || code != 3 {
			t.Errorf("run %d of `exit 3` through the holder: %d, %v; want 3", i, code, err)
		}
	}
}
