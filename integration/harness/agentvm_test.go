package harness

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// TestShellQuote: what Reproduce prints, a real sh reads back as the same
// arguments, and shellSplit (which reads agent-vm's hints) agrees.
func TestShellQuote(t *testing.T) {
	args := []string{`it's`, `say"hi"`, "$(touch pwned)", "`touch pwned`", "tab\there", "new\nline", `back\slash`, `glob*?[x]`, "${HOME}", "ünï", "", "plain", "a=b", "--state-dir", "/tmp/x y"}
	line := shellJoin(args)
	out, err := exec.Command("sh", "-c", `for a in "$@"; do printf '%s\0' "$a"; done`, "sh", "ARGS").Output()
	if err != nil || string(out) != "ARGS\x00" {
		t.Fatalf("sh does not work here: %v %q", err, out)
	}
	out, err = exec.Command("sh", "-c", `for a in `+line+`; do printf '%s\0' "$a"; done`).Output()
	if err != nil {
		t.Fatalf("sh rejects %s: %v", line, err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if strings.Join(got, "|") != strings.Join(args, "|") {
		t.Errorf("sh reads %q\nwant       %q", got, args)
	}
	split, err := ShellSplit(line)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(split, "|") != strings.Join(args, "|") || len(split) != len(args) {
		t.Errorf("shellSplit reads %q\nwant           %q", split, args)
	}
	if q := shellQuote("feature/x-1.2"); q != "feature/x-1.2" {
		t.Errorf("a plain word is quoted: %s", q)
	}
	for _, bad := range []string{"'open", `"open`} {
		if _, err := ShellSplit(bad); err == nil {
			t.Errorf("shellSplit(%q) did not fail", bad)
		}
	}
}

// standIn writes a small shell script that stands in for a child process
// of the runner, to test how the exec driver signals and waits. It is not
// agent-vm and plays no agent-vm behaviour; scenarios always run the real
// agent-vm.
func standIn(t *testing.T, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "stand-in")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestInterruptReachesChild: when the run's context ends, the child gets
// SIGINT (so agent-vm's own interrupt handling runs) and is waited for;
// it runs in its own process group, so a terminal's Ctrl-C reaches it only
// through the runner.
func TestInterruptReachesChild(t *testing.T) {
	bin := standIn(t, `trap 'echo got SIGINT >&2; exit 130' INT
echo "pgid $(ps -o pgid= -p $$)" >&2
while :; do sleep 0.05; done
`)
	av := &agentVM{bin: bin, stateDir: "/unused", dir: t.TempDir(), grace: 10 * time.Second,
		rep: &reporter{w: &syncBuffer{}, now: time.Now}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pgid string
	res := av.run(ctx, Call{Args: []string{"start"}, onLine: func(l string) {
		if p, ok := strings.CutPrefix(l, "pgid "); ok {
			pgid = strings.TrimSpace(p)
			cancel()
		}
	}})
	if !res.Interrupted || res.ExitCode != 130 || !strings.Contains(res.Stderr, "got SIGINT") {
		t.Fatalf("interrupted %v, %s, stderr %q: want the child to get SIGINT and exit 130", res.Interrupted, res.Outcome(), res.Stderr)
	}
	if own := syscall.Getpgrp(); pgid == "" || pgid == strconv.Itoa(own) {
		t.Errorf("the child ran in process group %q, want its own (ours is %d)", pgid, own)
	}
}

// TestUnresponsiveChildIsKilled: a child that ignores SIGINT is killed
// after the grace period, and the call says so.
func TestUnresponsiveChildIsKilled(t *testing.T) {
	bin := standIn(t, `trap '' INT
echo ready >&2
while :; do sleep 0.05; done
`)
	av := &agentVM{bin: bin, stateDir: "/unused", dir: t.TempDir(), grace: 300 * time.Millisecond,
		rep: &reporter{w: &syncBuffer{}, now: time.Now}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := av.run(ctx, Call{Args: []string{"start"}, onLine: func(string) { cancel() }})
	if !res.Interrupted || res.ExitCode != -1 || !strings.Contains(res.Outcome(), "signal: killed") {
		t.Fatalf("%s (err %v): want the child killed after the grace period", res.Outcome(), res.Err)
	}
}

// watchFor is a started watch with a short limit, whose QEMU count sees no
// QEMU of this machine's (its /proc is an empty directory).
func watchFor(t *testing.T, limit time.Duration) *blackbox.Watch {
	t.Helper()
	w := blackbox.NewTestWatch(limit, 20*time.Millisecond, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w.Start(ctx)
	return w
}

// TestStalledCallIsStopped: a call that shows no progress for the run's
// --stall limit is stopped (SIGINT), and its outcome says what it was
// waiting for, with its last line.
func TestStalledCallIsStopped(t *testing.T) {
	bin := standIn(t, `trap 'exit 130' INT
echo "waiting for SSH (1s): Booting" >&2
while :; do sleep 0.05; done
`)
	av := &agentVM{bin: bin, stateDir: "/unused", dir: t.TempDir(), grace: 10 * time.Second, watch: watchFor(t, 300*time.Millisecond),
		rep: &reporter{w: &syncBuffer{}, now: time.Now}}
	res := av.run(context.Background(), Call{Args: []string{"start", "x"}})
	if res.Stalled == nil || res.Interrupted || res.ExitCode != 130 {
		t.Fatalf("%s: want the call stopped for want of progress", res.Outcome())
	}
	for _, w := range []string{"no progress for 300ms", "while waiting for `agent-vm start x`, whose last line was: waiting for SSH (1s): Booting"} {
		if !strings.Contains(res.Outcome(), w) {
			t.Errorf("outcome %q lacks %q", res.Outcome(), w)
		}
	}
}

// TestSlowCallThatProgressesRuns: a call that takes many times the stall
// limit but prints something new within each is not stopped.
func TestSlowCallThatProgressesRuns(t *testing.T) {
	bin := standIn(t, `for i in a b c d e f g h i j; do echo "step $i" >&2; sleep 0.1; done
echo done`)
	av := &agentVM{bin: bin, stateDir: "/unused", dir: t.TempDir(), grace: 10 * time.Second, watch: watchFor(t, 400*time.Millisecond),
		rep: &reporter{w: &syncBuffer{}, now: time.Now}}
	res := av.run(context.Background(), Call{Args: []string{"template", "build"}})
	if res.Stalled != nil || res.ExitCode != 0 || res.Stdout != "done\n" {
		t.Fatalf("%s: want the progressing call to run to its end", res.Outcome())
	}
}
