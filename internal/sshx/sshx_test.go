package sshx

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
)

// sshd is a real OpenSSH server on 127.0.0.1 for the test (sshdtest).
type sshd struct {
	*sshdtest.Server
	target Target
}

func newSSHD(t *testing.T) *sshd {
	t.Helper()
	s := sshdtest.New(t)
	return &sshd{Server: s, target: Target{Addr: s.Addr, User: s.User, KeyFile: s.KeyFile, KnownHosts: s.KnownHosts}}
}

func TestWaitReadyWaitsForALateServer(t *testing.T) {
	s := newSSHD(t)
	time.AfterFunc(1500*time.Millisecond, s.Start)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	attempts := 0
	c, err := WaitReady(ctx, s.target, func(time.Duration, error) { attempts++ })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if attempts == 0 {
		t.Error("connected before the server started?")
	}
	var out, errOut bytes.Buffer
	code, err := Run(ctx, c, "echo out; echo err >&2; exit 7", nil, &out, &errOut)
	if err != nil || code != 7 || out.String() != "out\n" || errOut.String() != "err\n" {
		t.Errorf("run: code %d err %v stdout %q stderr %q", code, err, out.String(), errOut.String())
	}
	code, err = Run(ctx, c, Quote([]string{"printf", "%s|", "a b", "it's", "$(x)"}), nil, &out, &errOut)
	if err != nil || code != 0 || !strings.HasSuffix(out.String(), "a b|it's|$(x)|") {
		t.Errorf("quoted argv: %q, %v", out.String(), err)
	}
	code, _ = Run(ctx, c, "cat", strings.NewReader("piped"), &out, &errOut)
	if code != 0 || !strings.HasSuffix(out.String(), "piped") {
		t.Errorf("stdin not passed: %q", out.String())
	}
}

func TestHostKeyMismatchIsRefusedAtOnce(t *testing.T) {
	s := newSSHD(t)
	s.Start()
	other, _ := sshkeys.Generate("impostor")
	os.WriteFile(s.target.KnownHosts, []byte(sshkeys.KnownHostsLine(s.Port, other.Public)), 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := WaitReady(ctx, s.target, nil)
	if !errors.Is(err, ErrHostKeyMismatch) {
		t.Fatalf("got %v, want ErrHostKeyMismatch", err)
	}
	if ctx.Err() != nil {
		t.Errorf("a mismatch must not be retried until the deadline (took %s)", time.Since(start))
	}
}

func TestWaitReadyGivesUpWithTheLastReason(t *testing.T) {
	s := newSSHD(t) // never started
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := WaitReady(ctx, s.target, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("got %v", err)
	}
}

// Target.Config reads the key and the pin once: DialConfig connects with
// them after both files are gone, and still refuses another host key.
func TestDialConfigNeedsNoFile(t *testing.T) {
	s := newSSHD(t)
	s.Start()
	cfg, err := s.target.Config(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other := s.target
	other.KnownHosts = t.TempDir() + "/known_hosts"
	impostor, _ := sshkeys.Generate("impostor")
	os.WriteFile(other.KnownHosts, []byte(sshkeys.KnownHostsLine(s.Port, impostor.Public)), 0o600)
	wrong, err := other.Config(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{s.KeyFile, s.KnownHosts, other.KnownHosts} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	c, err := DialConfig(ctx, s.Addr, cfg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if code, err := Run(ctx, c, "true", nil, io.Discard, io.Discard); code != 0 || err != nil {
		t.Errorf("running true: code %d, %v", code, err)
	}
	if _, err := DialConfig(ctx, s.Addr, wrong, 10*time.Second); !errors.Is(err, ErrHostKeyMismatch) || !strings.Contains(err.Error(), s.Addr) {
		t.Errorf("with another key pinned: %v, want ErrHostKeyMismatch naming %s", err, s.Addr)
	}
	if _, err := (Target{KeyFile: s.KeyFile}).Config(time.Second); err == nil || !strings.Contains(err.Error(), s.KeyFile) {
		t.Errorf("a missing key file: %v, want an error naming it", err)
	}
}

// While paused says the server is paused on purpose (a hibernated guest),
// its silence is no missed keepalive and nothing is asked of it; once it
// does not, the silence ends Keepalive with an error.
func TestKeepaliveWhilePaused(t *testing.T) {
	s := newSSHD(t)
	s.Start()
	ctx := context.Background()
	c, err := WaitReady(ctx, s.target, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var paused atomic.Bool
	paused.Store(true)
	s.Freeze(true)
	defer s.Freeze(false)
	done := make(chan error, 1)
	go func() { done <- Keepalive(ctx, c, 50*time.Millisecond, 2, paused.Load) }()
	select {
	case err := <-done:
		t.Fatalf("Keepalive ended while the server was paused on purpose: %v", err)
	case <-time.After(time.Second): // ten intervals: long enough to have missed two
	}
	paused.Store(false)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "unanswered") {
			t.Errorf("Keepalive of a silent server: %v, want unanswered keepalives", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a silent server's keepalives were never missed")
	}
}

// Run on a connection whose server has stopped answering (its TCP
// connection open) gives up when its context ends, opening the session
// included, rather than waiting for ever.
func TestRunGivesUpOnASilentServer(t *testing.T) {
	s := newSSHD(t)
	s.Start()
	c, err := WaitReady(context.Background(), s.target, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s.Freeze(true)
	defer s.Freeze(false)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, c, "true", nil, io.Discard, io.Discard)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "opening an SSH session") {
			t.Errorf("Run on a silent server: %v, want its context's end while opening the session", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run on a silent server did not return when its context ended")
	}
}

// Run on a session whose command is never answered says in words what
// ended (not x/crypto/ssh's bare EOF): the session alone, its server
// closing the channel, or the whole connection. The server is a STAND-IN
// built on x/crypto/ssh: OpenSSH cannot be made to do either.
func TestRunSaysWhatEndedBeforeTheCommand(t *testing.T) {
	for name, tc := range map[string]struct {
		wholeConnection bool
		want            string
	}{
		"the channel":    {false, "the SSH session closed before the command started (the connection is up: the far end (the guest's sshd, or the VM's holder between) ended the session)"},
		"the connection": {true, "the SSH session closed before the command started (the connection to the guest "},
	} {
		t.Run(name, func(t *testing.T) {
			c := standInClosing(t, tc.wholeConnection)
			_, err := Run(context.Background(), c, "true", nil, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// standInClosing is a client of an SSH server that opens sessions and, at
// their exec request, closes the channel (or the whole connection)
// without an answer.
func standInClosing(t *testing.T, wholeConnection bool) *ssh.Client {
	t.Helper()
	host, err := sshkeys.Generate("stand-in")
	if err != nil {
		t.Fatal(err)
	}
	hostSigner, err := ssh.ParsePrivateKey(host.PrivatePEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(hostSigner)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		sc, chans, reqs, err := ssh.NewServerConn(conn, cfg)
		if err != nil {
			return
		}
		go ssh.DiscardRequests(reqs)
		for nc := range chans {
			ch, creqs, err := nc.Accept()
			if err != nil {
				continue
			}
			go func() {
				<-creqs // the exec request, left unanswered
				if wholeConnection {
					sc.Close()
				} else {
					ch.Close()
				}
			}()
		}
	}()
	c, err := ssh.Dial("tcp", ln.Addr().String(), &ssh.ClientConfig{User: "u", HostKeyCallback: ssh.InsecureIgnoreHostKey()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
