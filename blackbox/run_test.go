package blackbox

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestLineWriter(t *testing.T) {
	var lines []string
	w := &lineWriter{onLine: func(l string) { lines = append(lines, l) }}
	for _, p := range []string{"one\ntw", "o\n", "three"} {
		w.Write([]byte(p))
	}
	if strings.Join(lines, "|") != "one|two" || w.String() != "one\ntwo\nthree" {
		t.Errorf("lines %q, all %q", lines, w.String())
	}
}

func sh(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("sh")
	Need(t, err == nil, "sh is not installed")
	return p
}

func TestRunKeepsOutputAndStatus(t *testing.T) {
	var lines []string
	ex := Run(context.Background(), Cmd{Path: sh(t), Args: []string{"-c", `read x; echo "out $x"; echo e1 >&2; echo e2 >&2; exit 3`},
		Stdin: strings.NewReader("in\n"), OnLine: func(l string) { lines = append(lines, l) }})
	if ex.Code != 3 || ex.Stdout != "out in\n" || ex.Stderr != "e1\ne2\n" || strings.Join(lines, "|") != "e1|e2" {
		t.Errorf("got code %d, stdout %q, stderr %q, lines %q", ex.Code, ex.Stdout, ex.Stderr, lines)
	}
	if _, ok := ex.Err.(*exec.ExitError); !ok || ex.End.Before(ex.Start) {
		t.Errorf("err %v (want an *exec.ExitError), start %v, end %v", ex.Err, ex.Start, ex.End)
	}
	ex = Run(context.Background(), Cmd{Path: "/nonexistent/program"})
	if ex.Err == nil || ex.Code != -1 {
		t.Errorf("a program that cannot run: code %d, err %v", ex.Code, ex.Err)
	}
}

// When ctx ends the program gets SIGINT and may finish; one that ignores it
// is killed after Grace.
func TestRunInterruptsThenKills(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	ex := Run(ctx, Cmd{Path: sh(t), Args: []string{"-c", `trap 'echo got SIGINT; exit 130' INT; while :; do sleep 0.05; done`}, Grace: time.Minute})
	if ex.Code != 130 || ex.Stdout != "got SIGINT\n" {
		t.Errorf("a program that handles SIGINT: code %d, stdout %q, err %v", ex.Code, ex.Stdout, ex.Err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	ex = Run(ctx, Cmd{Path: sh(t), Args: []string{"-c", `trap '' INT; while :; do sleep 0.05; done`}, Grace: 300 * time.Millisecond})
	if ex.Code != -1 || ex.Err == nil {
		t.Errorf("a program that ignores SIGINT: code %d, err %v; want it killed", ex.Code, ex.Err)
	}
	if d := ex.End.Sub(ex.Start); d > 10*time.Second {
		t.Errorf("killing it took %s, want about the 300ms grace", d)
	}
}
