package guestctl

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
)

func TestParseSettleProbe(t *testing.T) {
	p, err := parseSettleProbe("cpu  100 5 50 9000 40 1 2 3 0 0\n1234\nadded 120 packages in 3m\n")
	if err != nil || !p.ok || p.busy != 100+5+50+1+2+3 || p.logSize != 1234 || p.last != "added 120 packages in 3m" {
		t.Errorf("got %+v, %v", p, err)
	}
	if p, err := parseSettleProbe("cpu  1 2 3 4 5\n"); err != nil || p.busy != 6 || p.logSize != 0 {
		t.Errorf("no log: got %+v, %v", p, err)
	}
	for _, bad := range []string{"", "intr 1 2 3\n", "cpu 1 x 3 4 5\n"} {
		if _, err := parseSettleProbe(bad); err == nil {
			t.Errorf("parseSettleProbe(%q) read it", bad)
		}
	}
}

// settleRig is this host's sshd standing in for the guest, with a log and
// a /proc/stat of the test's own that the test writes.
type settleRig struct {
	c         *ssh.Client
	log, stat string
}

func newSettleRig(t *testing.T) settleRig {
	t.Helper()
	srv := sshdtest.New(t)
	srv.Start()
	c, err := sshx.Dial(context.Background(), sshx.Target{Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	dir := t.TempDir()
	r := settleRig{c: c, log: filepath.Join(dir, "setup.log"), stat: filepath.Join(dir, "stat")}
	r.write(t, r.stat, "cpu  100 0 100 5000 0 0 0 0 0 0\n")
	r.write(t, r.log, "Cloud-init v. 22.4.2 running 'modules:final'\n")
	return r
}

func (settleRig) write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A setup that ends is waited for; each probe reports the log's last line.
func TestSettleWaitsForTheCommand(t *testing.T) {
	r := newSettleRig(t)
	var mu sync.Mutex
	var reported []string
	err := Settle(context.Background(), r.c, Settling{Command: "sleep 1", Log: r.log, Stall: time.Hour, Every: 100 * time.Millisecond,
		procStat: r.stat, Report: func(l string) { mu.Lock(); reported = append(reported, l); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reported) == 0 || reported[0] != "Cloud-init v. 22.4.2 running 'modules:final'" {
		t.Errorf("reported %q, want the log's last line", reported)
	}
	if err := Settle(context.Background(), r.c, Settling{Command: "echo broken >&2; exit 4", Stall: time.Hour, Every: time.Second, procStat: r.stat}); err == nil ||
		!strings.Contains(err.Error(), "exit status 4: broken") {
		t.Errorf("a failing command: %v", err)
	}
}

// A guest whose log grows, or whose CPUs are busy, goes on however long it
// takes; one where nothing moves ends with a StallError naming the log's
// last line. The guest moves between each two probes (the test moves it
// when a probe reports), so a probe or the test running late under load
// cannot make it look still.
func TestSettleStopsOnlyWhenNothingMoves(t *testing.T) {
	r := newSettleRig(t)
	const stall = 400 * time.Millisecond
	var mu sync.Mutex
	start := time.Now()
	var still time.Time // when the guest stopped moving
	lines := "Cloud-init v. 22.4.2 running 'modules:final'\n"
	busy := 200
	// Four stall limits of progress: the log grows, then the CPUs work.
	report := func(string) {
		mu.Lock()
		defer mu.Unlock()
		switch since := time.Since(start); {
		case !still.IsZero():
		case since < 2*stall:
			lines += "npm http fetch GET 200 https://registry.npmjs.org/x\n"
			r.write(t, r.log, lines)
		case since < 4*stall:
			busy += 100
			r.write(t, r.stat, "cpu  "+strconv.Itoa(busy)+" 0 0 5000 0 0 0 0 0 0\n")
		default:
			still = time.Now()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Settle(ctx, r.c, Settling{Command: "sleep 600", Log: r.log, Stall: stall, Every: 50 * time.Millisecond, procStat: r.stat, Report: report})
	mu.Lock()
	defer mu.Unlock()
	if still.IsZero() {
		t.Fatalf("settle ended while the guest made progress: %v", err)
	}
	var se *StallError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "made no progress for 400ms") ||
		!strings.Contains(err.Error(), "its last line: npm http fetch GET 200") {
		t.Errorf("got %v, want a StallError with the log's last line", err)
	}
	if waited := time.Since(still); waited < stall {
		t.Errorf("settle gave up %s after the guest stopped moving, before the stall limit %s", waited, stall)
	}
}

// A guest whose SSH stops answering with its connection open (a hung
// guest, a forward gone silent) ends the wait, saying so, instead of
// leaving it waiting for ever on a command that cannot end.
func TestSettleEndsWhenTheGuestStopsAnswering(t *testing.T) {
	srv := sshdtest.New(t)
	srv.Start()
	c, err := sshx.Dial(context.Background(), sshx.Target{Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := settleRig{c: c, log: filepath.Join(t.TempDir(), "setup.log"), stat: filepath.Join(t.TempDir(), "stat")}
	r.write(t, r.stat, "cpu  100 0 100 5000 0 0 0 0 0 0\n")
	r.write(t, r.log, "Cloud-init v. 22.4.2 running 'modules:final'\n")
	var once sync.Once
	defer srv.Freeze(false)
	done := make(chan error, 1)
	go func() {
		done <- Settle(context.Background(), c, Settling{Command: "sleep 600", Log: r.log, Stall: time.Hour, Every: 50 * time.Millisecond, procStat: r.stat,
			Report: func(string) { once.Do(func() { srv.Freeze(true) }) }})
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "stopped answering") || !strings.Contains(err.Error(), "unanswered") {
			t.Errorf("got %v, want an error saying the guest's SSH stopped answering", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Settle went on waiting on a guest that no longer answers")
	}
}

// Looks at the guest that fail count as seeing nothing move: a wait whose
// probes all fail ends at the stall limit, saying why they failed, rather
// than going on for ever.
func TestSettleStallsWhenEveryLookFails(t *testing.T) {
	r := newSettleRig(t)
	if err := os.Remove(r.stat); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := Settle(ctx, r.c, Settling{Command: "sleep 600", Log: r.log, Stall: 300 * time.Millisecond, Every: 50 * time.Millisecond, procStat: r.stat})
	var se *StallError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "the last look at the guest failed: not a /proc/stat cpu line") {
		t.Errorf("got %v, want a StallError saying the looks failed", err)
	}
}
