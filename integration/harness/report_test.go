package harness

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// syncBuffer is a bytes.Buffer safe to read while the reporter's progress
// goroutine writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestStepLines(t *testing.T) {
	var buf bytes.Buffer
	r := &reporter{w: &buf, now: time.Now}
	r.step(MarkPass, "create a VM", 1234*time.Millisecond, "note")
	r.step(MarkSkip, "list", 0, "")
	r.summary(3, 1, 2)
	want := "  ✓ create a VM" + strings.Repeat(" ", stepWidth-len("create a VM")) + "1.2s  note\n" +
		"  – list" + strings.Repeat(" ", stepWidth-len("list")) + "not run\n" +
		"3 passed, 1 failed, 2 skipped\n"
	if got := buf.String(); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}

	buf.Reset()
	r.color = true
	r.step(MarkFail, "x", time.Second, "")
	if !strings.Contains(buf.String(), styleRed+MarkFail+styleReset) {
		t.Errorf("with colour, the mark is not red: %q", buf.String())
	}
}

func TestColourDecision(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		tty   bool
		env   map[string]string
		color bool
	}{
		{true, nil, true},
		{false, nil, false},
		{true, map[string]string{"NO_COLOR": "1"}, false},
		{true, map[string]string{"NO_COLOR": ""}, true},
	} {
		if got := colorOn(Config{IsTerminal: c.tty, Getenv: env(c.env)}); got != c.color {
			t.Errorf("terminal %v, env %v: colour %v, want %v", c.tty, c.env, got, c.color)
		}
	}
}

func TestCommandDetail(t *testing.T) {
	var buf bytes.Buffer
	r := &reporter{w: &buf, now: time.Now}
	var lines []string
	for i := 1; i <= 50; i++ {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	res := &Result{Bin: "/opt/agent-vm", StateDir: "/tmp/s", Dir: "/tmp/r", Args: []string{"create", "it's"},
		ExitCode: 1, Stdout: strings.Join(lines, "\n") + "\n", Stderr: "agent-vm: bad\n", Elapsed: 300 * time.Millisecond}
	r.command(res, true)
	got := buf.String()
	for _, w := range []string{
		`$ cd /tmp/r && /opt/agent-vm --state-dir /tmp/s create 'it'\''s'`,
		"exit status 1 after 0.30s",
		"stdout (last 40 of 50 lines):", "| line 11\n", "| line 50\n",
		"stderr:\n", "| agent-vm: bad\n",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("the detail lacks %q:\n%s", w, got)
		}
	}
	if strings.Contains(got, "| line 10\n") {
		t.Errorf("the detail shows more than the last %d lines", tailLines)
	}
}

func TestOutcome(t *testing.T) {
	for _, c := range []struct {
		res  Result
		want string
	}{
		{Result{ExitCode: 0}, "exit status 0"},
		{Result{ExitCode: 130, Interrupted: true}, "interrupted (sent SIGINT), exit status 130"},
		{Result{ExitCode: -1, Elapsed: 12*time.Minute + 300*time.Millisecond, Err: exec.ErrWaitDelay,
			Stalled: &blackbox.StallError{Limit: 10 * time.Minute, Waiting: "`agent-vm start x`"}},
			"stopped after 12m0s: no progress for 10m0s (no new output, no guest console output, QEMU and the programs waited on idle) while waiting for `agent-vm start x` (sent SIGINT), " + exec.ErrWaitDelay.Error()},
	} {
		if got := c.res.Outcome(); got != c.want {
			t.Errorf("Outcome() = %q, want %q", got, c.want)
		}
	}
}

func TestFmtDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0.00s", 123 * time.Millisecond: "0.12s", 4300 * time.Millisecond: "4.3s",
		72 * time.Second: "1m12s", 10*time.Minute + 500*time.Millisecond: "10m01s",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestProgressLine(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := start
	p := &progress{now: func() time.Time { return now }, width: 60,
		tasks: []*task{{label: "booting itest/a", start: start, detail: "[INFO] waiting for ssh"}}}
	now = start.Add(42 * time.Second)
	if got, want := p.render(), "    … booting itest/a 42.0s: [INFO] waiting for ssh"; got != want {
		t.Errorf("render = %q, want %q", got, want)
	}
	p.tasks = append(p.tasks, &task{label: "booting itest/b", start: start.Add(2 * time.Second), detail: "x"})
	if got, want := p.render(), "    … booting itest/a 42.0s · booting itest/b 40.0s"; got != want {
		t.Errorf("two tasks: render = %q, want %q", got, want)
	}
	p.tasks[0].label = strings.Repeat("x", 100)
	if got := []rune(p.render()); len(got) != 59 || got[58] != '…' {
		t.Errorf("a long line is not cut to the width: %q", string(got))
	}

	// Off a terminal a line is due every progressEvery, counted from the
	// start and then from the last line.
	if p.due(start.Add(progressEvery - time.Second)) {
		t.Error("due before the first interval")
	}
	if !p.due(start.Add(progressEvery)) {
		t.Error("not due after the first interval")
	}
	p.lastLine = start.Add(progressEvery)
	if p.due(start.Add(2*progressEvery - time.Second)) {
		t.Error("due again too soon")
	}
}

// TestLiveProgress: on a terminal the progress line is drawn and redrawn in
// place, cleared before other output and when the wait ends.
func TestLiveProgress(t *testing.T) {
	var buf syncBuffer
	r := &reporter{w: &buf, live: true, width: 80, now: time.Now}
	tk := r.begin("booting itest/a")
	r.update(tk, "  [INFO] starting qemu  ")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := blackbox.Poll(ctx, "the progress line", func() bool { return strings.Contains(buf.String(), clearLine+"    … booting itest/a") }); err != nil {
		t.Fatalf("%v: %q", err, buf.String())
	}
	r.print("a step line\n")
	r.end(tk)
	got := buf.String()
	if !strings.Contains(got, ": [INFO] starting qemu") {
		t.Errorf("the progress line lacks the command's last line: %q", got)
	}
	if i := strings.Index(got, "a step line"); i < len(clearLine) || got[i-len(clearLine):i] != clearLine {
		t.Errorf("the progress line is not cleared before other output: %q", got)
	}
	if !strings.HasSuffix(got, clearLine) {
		t.Errorf("the progress line is not cleared at the end: %q", got)
	}
}

func TestRedactSecrets(t *testing.T) {
	tok := "23f696cb50cc53af91cfc2b44fc02c038ba7e00154b8aceb7b7a7f16051f14dd"
	for _, in := range []string{
		`  "mcp": {"url": "u", "token": "` + tok + `"}`,
		"token:      " + tok + " (`agent-vm mcp-config x` prints a client entry)",
		"Authorization: Bearer " + tok,
	} {
		got := redactSecrets(in)
		if strings.Contains(got, tok) || !strings.Contains(got, "<redacted>") {
			t.Errorf("redactSecrets(%q) = %q", in, got)
		}
	}
	if got := redactSecrets(`"state": "running"`); got != `"state": "running"` {
		t.Errorf("redacted what is no secret: %q", got)
	}
	var b strings.Builder
	writeTail(&b, "stdout", `{"token": "`+tok+`"}`)
	if strings.Contains(b.String(), tok) {
		t.Errorf("a command's output shows the token: %s", b.String())
	}
}

// TestStepUnlessSaysWhy: in a vagrant run a step the backend cannot do is
// not run, and its line says why; in another run it runs.
func TestStepUnlessSaysWhy(t *testing.T) {
	for _, backend := range []string{"vagrant", "libvirt", "qemu", ""} {
		var buf bytes.Buffer
		s := &S{rep: &reporter{w: &buf, now: time.Now}, backend: backend, interrupted: func() bool { return false }}
		ran := false
		s.StepUnless(context.Background(), "port add: a guest HTTP server answers on the host", s.Lacks(FeaturePorts), func() error { ran = true; return nil })
		skipped := strings.Contains(buf.String(), "skipped: the vagrant backend forwards only the SSH and MCP ports")
		if want := backend == "vagrant"; ran == want || skipped != want {
			t.Errorf("--backend %q: ran %v, line %q", backend, ran, buf.String())
		}
	}
}
