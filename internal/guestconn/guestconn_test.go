package guestconn

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/hold"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	"github.com/agent-vm/agent-vm/internal/state"
)

// A VM directory whose "guest" is a real sshd on 127.0.0.1 (sshdtest):
// its record, client key and pinned host key as create makes them.
func sshdVM(t *testing.T) (Guest, *state.Record, state.Layout) {
	t.Helper()
	s := sshdtest.New(t)
	s.Start()
	l := state.Layout{Dir: t.TempDir()}
	for _, d := range []string{l.SSHDir(), l.RunDir(), l.LogsDir()} {
		os.MkdirAll(d, 0o700)
	}
	key, _ := os.ReadFile(s.KeyFile)
	known, _ := os.ReadFile(s.KnownHosts)
	os.WriteFile(l.ClientKey(), key, 0o600)
	os.WriteFile(l.KnownHosts(), known, 0o600)
	r := &state.Record{Version: state.RecordVersion, ID: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", Branch: "held", Slug: "held",
		Guest: state.Guest{User: s.User}, Ports: state.Ports{SSH: s.Port, MCP: 1}}
	if err := state.WriteRecord(l.Record(), r); err != nil {
		t.Fatal(err)
	}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: testLogWriter{t}})
	return Guest{Record: r, Layout: l, Log: log}, r, l
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// echoOver dials the guest as every command does and runs echo; it
// returns the network the connection went over.
func echoOver(t *testing.T, g Guest) string {
	t.Helper()
	c, err := g.Dial(context.Background())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	// stdout alone: the stand-in guest is this host's sshd, whose user's
	// shell startup files may write to stderr (a pyenv rehash racing
	// another login's does).
	var out, errOut strings.Builder
	if code, err := sshx.Run(context.Background(), c, "echo hi", nil, &out, &errOut); err != nil || code != 0 || out.String() != "hi\n" {
		t.Fatalf("echo: %d %v %q (stderr %q)", code, err, out.String(), errOut.String())
	}
	return c.RemoteAddr().Network()
}

func TestDialGuestPrefersTheHolderAndFallsBack(t *testing.T) {
	g, r, l := sshdVM(t)
	f := g.Files()

	// No holder: the guest directly.
	if got := echoOver(t, g); got != "tcp" {
		t.Errorf("without a holder: over %s, want tcp", got)
	}
	// A dead holder's socket: the guest directly.
	ln, err := net.Listen("unix", f.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if got := echoOver(t, g); got != "tcp" {
		t.Errorf("with a dead socket: over %s, want tcp", got)
	}

	// A holder (the __hold command's code, in this process): through it.
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { ended <- Guest{Record: r, Layout: l, Log: g.Log.Named("hold")}.Serve(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := hold.Dial(context.Background(), f, r.Guest.User, time.Second); err == nil {
			c.Close()
			break
		}
		select {
		case err := <-ended:
			t.Fatalf("the holder ended: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder does not serve")
		}
	}
	if got := echoOver(t, g); got != "unix" {
		t.Errorf("with a holder: over %s, want its unix socket", got)
	}

	// The holder gone: the guest directly again.
	cancel()
	if err := <-ended; err != nil {
		t.Errorf("the holder: %v", err)
	}
	if got := echoOver(t, g); got != "tcp" {
		t.Errorf("after the holder ended: over %s, want tcp", got)
	}
}
