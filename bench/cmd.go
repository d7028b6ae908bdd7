package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// cmdSpec is a program to run and how.
type cmdSpec struct {
	Path    string
	Args    []string
	Dir     string
	Env     []string // nil: the harness's environment
	Stdin   io.Reader
	Timeout time.Duration // 0: only ctx bounds it
	// OnLine receives each line the program writes to stderr, as it comes.
	OnLine func(string)
}

// cmdResult is a finished program.
type cmdResult struct {
	Line   string // the command line, for messages
	Stdout string
	Stderr string
	Exit   int // -1 when it did not exit by itself
	Start  time.Time
	End    time.Time
	// Err is set when the program could not run, exited non-zero, was
	// killed or timed out.
	Err error
}

// Seconds is the wall time from start to exit.
func (r cmdResult) Seconds() float64 { return r.End.Sub(r.Start).Seconds() }

// cancelGrace is how long a program has to exit after SIGINT (agent-vm
// stops a VM it was booting) before it is killed.
const cancelGrace = 45 * time.Second

// runCmd runs a program with blackbox.Run: in its own process group, so a
// Ctrl-C on the terminal reaches it only through us; when ctx ends or the
// timeout passes it gets SIGINT, then SIGKILL after cancelGrace.
func runCmd(ctx context.Context, s cmdSpec) cmdResult {
	res := cmdResult{Line: shellJoin(append([]string{s.Path}, s.Args...)), Exit: -1}
	if s.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.Timeout)
		defer cancel()
	}
	ex := blackbox.Run(ctx, blackbox.Cmd{Path: s.Path, Args: s.Args, Dir: s.Dir, Env: s.Env, Stdin: s.Stdin,
		Grace: cancelGrace, OnLine: s.OnLine})
	res.Stdout, res.Stderr, res.Exit, res.Start, res.End = ex.Stdout, ex.Stderr, ex.Code, ex.Start, ex.End
	switch {
	case ex.Err == nil:
	case ctx.Err() != nil:
		res.Err = fmt.Errorf("`%s` was stopped (%w)%s", res.Line, context.Cause(ctx), tailSuffix(res.Stderr))
	default:
		res.Err = fmt.Errorf("`%s`: %w%s", res.Line, ex.Err, tailSuffix(res.Stderr))
	}
	return res
}

// tailSuffix is the last lines of a program's stderr, for an error.
func tailSuffix(stderr string) string {
	t := tail(stderr, 3)
	if t == "" {
		return ""
	}
	return ": " + t
}

// tail is the last n non-empty lines of s, joined with " / ".
func tail(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}

// shellJoin quotes argv for a shell, for messages and the results file.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%^", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// logger prints the harness's progress to stderr, each line stamped with
// the time since the run began.
type logger struct {
	mu    sync.Mutex
	w     io.Writer
	began time.Time
}

func newLogger(w io.Writer, began time.Time) *logger { return &logger{w: w, began: began} }

func (l *logger) Printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := time.Since(l.began)
	fmt.Fprintf(l.w, "[%02d:%02d] %s\n", int(e.Minutes()), int(e.Seconds())%60, fmt.Sprintf(format, args...))
}

// errInterrupted marks a run ended by SIGINT or SIGTERM.
var errInterrupted = errors.New("interrupted")
