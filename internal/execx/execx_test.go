package execx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRunKeepsStdoutAndStderrTail(t *testing.T) {
	res, err := OS{}.Run(context.Background(), Cmd{Path: "sh", Args: []string{"-c", "echo out; echo oops >&2; exit 3"}})
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v, want *Error", err)
	}
	if e.ExitCode != 3 || res.ExitCode != 3 {
		t.Errorf("exit code: got %d/%d, want 3", e.ExitCode, res.ExitCode)
	}
	if string(res.Stdout) != "out\n" {
		t.Errorf("stdout: got %q", res.Stdout)
	}
	if !strings.Contains(err.Error(), "oops") || !strings.Contains(err.Error(), "sh -c") {
		t.Errorf("error %q should name the command and carry stderr", err)
	}
}

func TestRunCancelKillsProcessGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// The grandchild records its pid and sleeps; cancelling must kill it too.
		_, err := OS{}.Run(ctx, Cmd{Path: "sh", Args: []string{"-c", "sleep 60 & echo $! > " + pidFile + "; wait"}})
		done <- err
	}()
	var pid int
	for i := 0; i < 200 && pid == 0; i++ {
		time.Sleep(10 * time.Millisecond)
		b, _ := os.ReadFile(pidFile)
		_, _ = fmt.Sscan(strings.TrimSpace(string(b)), &pid)
	}
	if pid == 0 {
		t.Fatal("child never wrote its pid")
	}
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); err != nil {
			return
		}
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if strings.Contains(string(b), ") Z ") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("grandchild %d still alive after cancel", pid)
}

// A program Run started dies with us even when we are SIGKILLed and get no
// chance to cancel it. The test binary re-runs itself as the parent.
func TestRunChildDiesWithSIGKILLedParent(t *testing.T) {
	if pidFile := os.Getenv("EXECX_TEST_PARENT"); pidFile != "" {
		_, _ = OS{}.Run(context.Background(), Cmd{Path: "sh", Args: []string{"-c", "echo $$ > " + pidFile + "; exec sleep 60"}})
		os.Exit(0)
	}
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	parent := exec.Command(os.Args[0], "-test.run=^TestRunChildDiesWithSIGKILLedParent$")
	parent.Env = append(os.Environ(), "EXECX_TEST_PARENT="+pidFile)
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	for i := 0; i < 500 && pid == 0; i++ {
		time.Sleep(10 * time.Millisecond)
		b, _ := os.ReadFile(pidFile)
		_, _ = fmt.Sscan(strings.TrimSpace(string(b)), &pid)
	}
	if pid == 0 {
		parent.Process.Kill()
		t.Fatal("child never wrote its pid")
	}
	parent.Process.Kill()
	parent.Wait()
	for i := 0; i < 500; i++ {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Errorf("child %d outlived its SIGKILLed parent", pid)
}

func TestStartDetachedWritesLogAndReportsExit(t *testing.T) {
	log := filepath.Join(t.TempDir(), "out.log")
	p, err := OS{}.Start(Detached{Path: "sh", Args: []string{"-c", "echo hello; echo err >&2; exit 4"}, StdoutPath: log})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("detached process did not exit")
	}
	if p.ExitCode() != 4 {
		t.Errorf("exit code: got %d, want 4", p.ExitCode())
	}
	b, _ := os.ReadFile(log)
	if string(b) != "hello\nerr\n" {
		t.Errorf("log: got %q", b)
	}
	fi, _ := os.Stat(log)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("log mode: got %v, want 0600", fi.Mode().Perm())
	}
}

// TestStartDetachedStdin: Stdin reaches the program through a pipe that
// ends (the program sees EOF); without it, stdin is empty.
func TestStartDetachedStdin(t *testing.T) {
	for _, c := range []struct {
		stdin []byte
		want  string
	}{{[]byte("secret bundle\n"), "[secret bundle]"}, {nil, "[]"}} {
		log := filepath.Join(t.TempDir(), "out.log")
		p, err := OS{}.Start(Detached{Path: "sh", Args: []string{"-c", `printf '[%s]' "$(cat)"`}, StdoutPath: log, Stdin: c.stdin})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Exited():
		case <-time.After(10 * time.Second):
			t.Fatal("the program did not see its stdin end")
		}
		if b, _ := os.ReadFile(log); string(b) != c.want {
			t.Errorf("stdin %q: the program read %q, want %q", c.stdin, b, c.want)
		}
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"":             "''",
		"plain/path-1": "plain/path-1",
		"a b":          "'a b'",
		"it's":         `'it'\''s'`,
		"$(x)":         "'$(x)'",
	} {
		if got := ShellQuote(in); got != want {
			t.Errorf("ShellQuote(%q): got %q, want %q", in, got, want)
		}
	}
}

func TestTail(t *testing.T) {
	in := []byte(strings.Repeat("x", 50) + "\n" + "last line")
	if got := Tail(in, 20); got != "last line" {
		t.Errorf("got %q", got)
	}
	if got := TailLines("a\nb\nc\n", 2); got != "b\nc" {
		t.Errorf("got %q", got)
	}
}
