package blackbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// clock is a time the test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// stat is a /proc/PID/stat line with the fields parseStat reads.
func stat(pid int, comm string, pgrp int, utime, stime uint64) string {
	return fmt.Sprintf("%d (%s) S 1 %d %d 0 -1 4194560 0 0 0 0 %d %d 0 0 20 0 1 0 1 0 0\n", pid, comm, pgrp, pgrp, utime, stime)
}

// newTestWatch is a Watch over a /proc of the test's own, on a clock the
// test moves, sampled only when the test says.
func newTestWatch(t *testing.T, files ...string) (*Watch, *clock, string) {
	proc := t.TempDir()
	c := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	w := NewWatch(10*time.Minute, func() []string { return files })
	w.now, w.proc = c.now, proc
	w.mu.Lock()
	w.started, w.last, w.lastWhat = true, c.now(), "the run began"
	w.mu.Unlock()
	w.sample()
	return w, c, proc
}

func TestWatchCountsWhatMoves(t *testing.T) {
	console := filepath.Join(t.TempDir(), "console.log")
	writeFile(t, console, "boot\n")
	w, c, proc := newTestWatch(t, console)
	idle := func() time.Duration { d, _ := w.Idle(); return d }

	// Nothing moved: idle grows with the clock.
	c.add(time.Minute)
	w.sample()
	if idle() != time.Minute {
		t.Fatalf("idle %s after a quiet minute, want 1m", idle())
	}
	// A console that grows moves.
	writeFile(t, console, "boot\nlogin:\n")
	c.add(time.Minute)
	w.sample()
	if d, what := w.Idle(); d != 0 || !strings.Contains(what, "console.log grew") {
		t.Fatalf("after the console grew: idle %s, last %q", d, what)
	}
	// A QEMU using a core moves; one using a few percent does not.
	writeFile(t, filepath.Join(proc, "41", "stat"), stat(41, "qemu-system-x86", 41, 1000, 200))
	c.add(time.Minute)
	w.sample() // first sight of it: nothing to compare with
	if idle() != time.Minute {
		t.Fatalf("a QEMU first seen counted: idle %s", idle())
	}
	writeFile(t, filepath.Join(proc, "41", "stat"), stat(41, "qemu-system-x86", 41, 1010, 202)) // 0.12 s in 5 s
	c.add(time.Minute)
	w.sample()
	if idle() != 2*time.Minute {
		t.Fatalf("an idle QEMU (2%% of a core) counted: idle %s", idle())
	}
	writeFile(t, filepath.Join(proc, "41", "stat"), stat(41, "qemu-system-x86", 41, 1400, 210)) // 4 s in 5 s
	c.add(time.Minute)
	w.sample()
	if d, what := w.Idle(); d != 0 || !strings.Contains(what, "used 4.0 s of CPU") {
		t.Fatalf("a busy QEMU: idle %s, last %q", d, what)
	}
	// Another program counts only while its process group is tracked.
	writeFile(t, filepath.Join(proc, "77", "stat"), stat(77, "agent-vm", 77, 0, 0))
	untrack := w.Track(77)
	c.add(time.Minute)
	w.sample()
	writeFile(t, filepath.Join(proc, "77", "stat"), stat(77, "agent-vm", 77, 300, 0))
	c.add(time.Minute)
	w.sample()
	if idle() != 0 {
		t.Fatalf("a tracked busy program did not count: idle %s", idle())
	}
	untrack()
	writeFile(t, filepath.Join(proc, "77", "stat"), stat(77, "agent-vm", 77, 900, 0))
	c.add(time.Minute)
	w.sample()
	if idle() != time.Minute {
		t.Fatalf("an untracked program counted: idle %s", idle())
	}
}

func TestWatchLinesMoveOnceNumbersAside(t *testing.T) {
	w, c, _ := newTestWatch(t)
	c.add(time.Minute)
	w.Line("waiting for SSH (1m15s): Booting the kernel")
	if d, _ := w.Idle(); d != 0 {
		t.Fatalf("a new line did not count: idle %s", d)
	}
	c.add(time.Minute)
	w.Line("waiting for SSH (1m30s): Booting the kernel")
	w.Line("   ")
	if d, _ := w.Idle(); d != time.Minute {
		t.Fatalf("the same progress line with another time counted: idle %s", d)
	}
	w.Line("waiting for SSH (1m45s): Reached target Network")
	if d, what := w.Idle(); d != 0 || !strings.Contains(what, "Reached target Network") {
		t.Fatalf("a new console line did not count: idle %s, last %q", d, what)
	}
}

func TestParseStat(t *testing.T) {
	comm, pgrp, ticks, ok := parseStat([]byte(stat(9, "a (b) c", 7, 30, 12)))
	if !ok || comm != "a (b) c" || pgrp != 7 || ticks != 42 {
		t.Errorf("got %q %d %d %v", comm, pgrp, ticks, ok)
	}
	for _, bad := range []string{"", "9 (x", "9 (x) S 1 2"} {
		if _, _, _, ok := parseStat([]byte(bad)); ok {
			t.Errorf("parseStat(%q) read it", bad)
		}
	}
	// This process's own stat parses.
	b, err := os.ReadFile("/proc/self/stat")
	Need(t, err == nil, "no /proc here")
	if _, _, _, ok := parseStat(b); !ok {
		t.Errorf("parseStat could not read /proc/self/stat: %q", b)
	}
}

// A context of a watch where nothing moves ends with a StallError that
// says what the step waited for.
func TestWatchContextEndsOnAStall(t *testing.T) {
	w := NewWatch(50*time.Millisecond, nil)
	w.every = 10 * time.Millisecond
	w.proc = t.TempDir() // no QEMU of the machine's counts here
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	w.Start(ctx)
	cctx, cancel := w.Context(ctx, func() string { return "`agent-vm start x`" })
	defer cancel()
	select {
	case <-cctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the context did not end")
	}
	var se *StallError
	if !errors.As(context.Cause(cctx), &se) {
		t.Fatalf("cause %v, want a *StallError", context.Cause(cctx))
	}
	if msg := se.Error(); !strings.Contains(msg, "no progress for 50ms") || !strings.Contains(msg, "while waiting for `agent-vm start x`") ||
		!strings.Contains(msg, "the run began") {
		t.Errorf("message %q", msg)
	}
}

// A program Run runs with a watch is tracked while it runs and its lines
// move the watch.
func TestRunFeedsTheWatch(t *testing.T) {
	w, c, _ := newTestWatch(t)
	c.add(time.Hour)
	ex := Run(context.Background(), Cmd{Path: sh(t), Args: []string{"-c", "echo first line; echo second >&2"}, Watch: w})
	if ex.Code != 0 {
		t.Fatalf("code %d, err %v", ex.Code, ex.Err)
	}
	if d, _ := w.Idle(); d != 0 {
		t.Errorf("idle %s: want the program's lines to move the watch", d)
	}
	w.mu.Lock()
	left, seen := len(w.groups), w.seen["first line"] && w.seen["second"]
	w.mu.Unlock()
	if !seen {
		t.Errorf("the watch did not see both the stdout and the stderr line")
	}
	if left != 0 {
		t.Errorf("%d process groups still tracked after the program ended", left)
	}
}
