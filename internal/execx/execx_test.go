package execx_test

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

	"github.com/agent-vm/agent-vm/internal/execx"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

func TestRunKeepsStdoutAndStderrTail(t *testing.T) {
	res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: "sh", Args: []string{"-c", "echo out; echo oops >&2; exit 3"}})
	var e *execx.Error
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

// pidIn waits for a process to write its pid to file.
func pidIn(t *testing.T, file string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pid int
	if err := tu.Poll(ctx, "the child's pid in "+file, func() bool {
		b, _ := os.ReadFile(file)
		_, _ = fmt.Sscan(strings.TrimSpace(string(b)), &pid)
		return pid != 0
	}); err != nil {
		t.Fatal(err)
	}
	return pid
}

// gone waits for process pid to end: no longer in /proc, or a zombie.
func gone(pid int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return tu.Poll(ctx, "the end of process "+strconv.Itoa(pid), func() bool {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		return err != nil || strings.Contains(string(b), ") Z ")
	}) == nil
}

func TestRunCancelKillsProcessGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// The grandchild records its pid and sleeps; cancelling must kill it too.
		_, err := execx.OS{}.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", "sleep 60 & echo $! > " + pidFile + "; wait"}})
		done <- err
	}()
	pid := pidIn(t, pidFile)
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if !gone(pid) {
		t.Errorf("grandchild %d still alive after cancel", pid)
	}
}

// A program Run started dies with us even when we are SIGKILLed and get no
// chance to cancel it. The test binary re-runs itself as the parent.
func TestRunChildDiesWithSIGKILLedParent(t *testing.T) {
	if pidFile := os.Getenv("EXECX_TEST_PARENT"); pidFile != "" {
		_, _ = execx.OS{}.Run(context.Background(), execx.Cmd{Path: "sh", Args: []string{"-c", "echo $$ > " + pidFile + "; exec sleep 60"}})
		os.Exit(0)
	}
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	parent := exec.Command(os.Args[0], "-test.run=^TestRunChildDiesWithSIGKILLedParent$")
	parent.Env = append(os.Environ(), "EXECX_TEST_PARENT="+pidFile)
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = parent.Process.Kill() })
	pid := pidIn(t, pidFile)
	parent.Process.Kill()
	parent.Wait()
	if !gone(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("child %d outlived its SIGKILLed parent", pid)
	}
}

func TestStartDetachedWritesLogAndReportsExit(t *testing.T) {
	log := filepath.Join(t.TempDir(), "out.log")
	p, err := execx.OS{}.Start(execx.Detached{Path: "sh", Args: []string{"-c", "echo hello; echo err >&2; exit 4"}, StdoutPath: log})
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
		p, err := execx.OS{}.Start(execx.Detached{Path: "sh", Args: []string{"-c", `printf '[%s]' "$(cat)"`}, StdoutPath: log, Stdin: c.stdin})
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
		if got := execx.ShellQuote(in); got != want {
			t.Errorf("ShellQuote(%q): got %q, want %q", in, got, want)
		}
	}
}

func TestTail(t *testing.T) {
	in := []byte(strings.Repeat("x", 50) + "\n" + "last line")
	if got := execx.Tail(in, 20); got != "last line" {
		t.Errorf("got %q", got)
	}
	if got := execx.TailLines("a\nb\nc\n", 2); got != "b\nc" {
		t.Errorf("got %q", got)
	}
}
