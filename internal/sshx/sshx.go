// Package sshx is agent-vm's SSH client (golang.org/x/crypto/ssh): it
// connects only to the host key pinned at create, waits for a booting guest
// with backoff, runs commands with their exit status, and opens an
// interactive PTY shell.
package sshx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
)

// Target says where and as whom to connect.
type Target struct {
	Addr       string // "127.0.0.1:2222"
	User       string
	KeyFile    string // private key
	KnownHosts string // pinned host key
}

// ErrHostKeyMismatch means something answered with a host key other than the
// pinned one. It is never retried: it is either another program on the port
// or an attack.
var ErrHostKeyMismatch = errors.New("host key mismatch")

// Config is the client configuration for t: its private key and its
// pinned host key read now, into memory, so that connecting with it later
// (DialConfig) reads no file. A process that drops privileges after
// reading a root-owned key can still connect again.
func (t Target) Config(timeout time.Duration) (*ssh.ClientConfig, error) {
	signer, err := sshkeys.LoadSigner(t.KeyFile)
	if err != nil {
		return nil, err
	}
	hk, err := sshkeys.HostKeyCallback(t.KnownHosts)
	if err != nil {
		return nil, err
	}
	return &ssh.ClientConfig{
		User:              t.User,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback:   hk,
		HostKeyAlgorithms: []string{ssh.KeyAlgoED25519},
		Timeout:           timeout,
	}, nil
}

// Dial connects once. The whole handshake is bounded by timeout and ctx.
func Dial(ctx context.Context, t Target, timeout time.Duration) (*ssh.Client, error) {
	cfg, err := t.Config(timeout)
	if err != nil {
		return nil, err
	}
	return dial(ctx, t.Addr, cfg, timeout, " in "+t.KnownHosts)
}

// DialConfig connects once to addr with cfg (Target.Config's), as Dial
// does: the whole handshake is bounded by timeout and ctx, and a host key
// other than the pinned one is ErrHostKeyMismatch.
func DialConfig(ctx context.Context, addr string, cfg *ssh.ClientConfig, timeout time.Duration) (*ssh.Client, error) {
	return dial(ctx, addr, cfg, timeout, "")
}

// dial is Dial and DialConfig; pinnedIn names where the pin was read, for
// the mismatch's message.
func dial(ctx context.Context, addr string, cfg *ssh.ClientConfig, timeout time.Duration, pinnedIn string) (*ssh.Client, error) {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// The handshake has no context of its own: a deadline bounds it, and
	// cancellation closes the connection.
	_ = conn.SetDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		var ke *knownhosts.KeyError
		if errors.As(err, &ke) && len(ke.Want) > 0 {
			return nil, fmt.Errorf("%s presented a host key other than the one pinned%s (hint: another program may be listening on that port; agent-vm will not connect to it): %w", addr, pinnedIn, ErrHostKeyMismatch)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

// Progress is told about each failed attempt while waiting.
type Progress func(elapsed time.Duration, lastErr error)

// WaitReady dials until the guest answers with the pinned key and accepts
// the key, or ctx ends. Refused, reset and timed-out connections mean "not
// yet" (QEMU's user networking accepts and resets until sshd listens); a
// host key mismatch ends the wait at once.
func WaitReady(ctx context.Context, t Target, progress Progress) (*ssh.Client, error) {
	start := time.Now()
	delay := 250 * time.Millisecond
	var last error
	for {
		c, err := Dial(ctx, t, 10*time.Second)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, ErrHostKeyMismatch) {
			return nil, err
		}
		if ctx.Err() != nil {
			if last == nil {
				last = err
			}
			return nil, fmt.Errorf("SSH on %s not ready after %s (last error: %v): %w", t.Addr, time.Since(start).Truncate(time.Second), describe(last), ctx.Err())
		}
		last = err
		if progress != nil {
			progress(time.Since(start), err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		if delay < 2*time.Second {
			delay = delay * 3 / 2
		}
	}
}

// describe shortens the usual not-ready errors.
func describe(err error) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "connection refused"):
		return "connection refused"
	case strings.Contains(s, "connection reset"), strings.Contains(s, "EOF"):
		return "connection reset (sshd not listening yet)"
	case strings.Contains(s, "unable to authenticate"):
		return "the key was not accepted (yet)"
	}
	return s
}

// Run runs cmd (a shell command line) and returns its exit code. Only a
// failure to run it at all is an error; a non-zero exit is a code.
func Run(ctx context.Context, c *ssh.Client, cmd string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	s, err := newSession(ctx, c)
	if err != nil {
		return -1, fmt.Errorf("opening an SSH session: %w", err)
	}
	defer s.Close()
	s.Stdin, s.Stdout, s.Stderr = stdin, stdout, stderr
	stop := context.AfterFunc(ctx, func() {
		_ = s.Signal(ssh.SIGTERM)
		s.Close()
	})
	defer stop()
	code, err := exitStatus(ctx, s.Run(cmd))
	var missing *ssh.ExitMissingError
	switch {
	case errors.As(err, &missing):
		return -1, fmt.Errorf("the remote command ended without an exit status (%s)", connectionEnd(c, "it was killed by a signal"))
	case errors.Is(err, io.EOF):
		// x/crypto/ssh's bare EOF: the channel closed before the command
		// was started (its request unanswered).
		return -1, fmt.Errorf("the SSH session closed before the command started (%s)", connectionEnd(c, "the far end (the guest's sshd, or the VM's holder between) ended the session"))
	}
	return code, err
}

// connectionEnd says whether c's connection has ended, and why (what
// x/crypto/ssh read or was told last: a peer's disconnect, a MAC failure,
// a reset), else other: a session's end alone. A connection that ends
// takes its sessions with it at once, so a short wait tells the two apart.
func connectionEnd(c *ssh.Client, other string) string {
	ended := make(chan error, 1)
	go func() { ended <- c.Wait() }() // returns when c is closed, by its caller at the latest
	select {
	case err := <-ended:
		if err == nil || errors.Is(err, io.EOF) {
			return "the connection to the guest was closed"
		}
		return "the connection to the guest ended: " + err.Error()
	case <-time.After(200 * time.Millisecond):
		return "the connection is up: " + other
	}
}

// newSession opens a session on c, or gives up when ctx ends: on a
// connection whose far end has stopped answering with its TCP connection
// open, opening a channel waits for ever. A session opened after that is
// closed.
func newSession(ctx context.Context, c *ssh.Client) (*ssh.Session, error) {
	type opened struct {
		s   *ssh.Session
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		s, err := c.NewSession()
		ch <- opened{s, err}
	}()
	select {
	case o := <-ch:
		return o.s, o.err
	case <-ctx.Done():
		go func() {
			if o := <-ch; o.s != nil {
				o.s.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// exitStatus turns a session's end into the remote exit code. Only a
// failure to run the command at all is an error.
func exitStatus(ctx context.Context, err error) (int, error) {
	var ee *ssh.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		return ee.ExitStatus(), nil
	case ctx.Err() != nil:
		return -1, ctx.Err()
	}
	return -1, err
}

// Quote joins argv into a shell command line that runs exactly argv.
func Quote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
