package proc

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// A process is found, verified and killed by its command line; once it is
// gone its pid matches nothing.
func TestFindKillWait(t *testing.T) {
	marker := "proc-test-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	// A builtin that blocks (read, on a pipe nobody writes to), so that sh
	// stays the process and forks nothing: a child between its fork and
	// its exec would carry the marker too, and outlive the kill for a
	// moment. The marker is its $0.
	cmd := exec.Command("sh", "-c", "read x", marker)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait() // reap it, so that it does not linger as a zombie
	match := func(args []string) bool { return slices.Contains(args, marker) }
	pid := cmd.Process.Pid
	// Start returns once the child is forked, maybe before it has exec'd
	// sh (its command line is then still empty, or the test's own): wait
	// for the exec, not a time.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tu.Poll(ctx, "sh to run with the marker", func() bool { return slices.Contains(Args(pid), marker) }); err != nil {
		t.Fatalf("%v (args %q)", err, Args(pid))
	}
	if got := Find(match); got != pid {
		t.Fatalf("Find: got %d, want %d (args %q)", got, pid, Args(pid))
	}
	if Verified(pid, func([]string) bool { return false }) {
		t.Error("Verified a process its matcher refuses")
	}
	if !Kill(pid, match) {
		t.Fatal("Kill did not kill the matching process")
	}
	if !WaitGone(pid, match, 5*time.Second) || Verified(pid, match) || Find(match) != 0 {
		t.Errorf("pid %d still matches after Kill", pid)
	}
	if Kill(pid, match) || Signal(pid, match, 0) {
		t.Error("a gone process was signalled")
	}
}

func TestReadPid(t *testing.T) {
	dir := t.TempDir()
	for content, want := range map[string]int{"42\n": 42, "0": 0, "x": 0} {
		p := dir + "/pid"
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadPid(p)
		if got != want || (want == 0) != (err != nil) {
			t.Errorf("%q: got %d, %v; want %d", content, got, err, want)
		}
	}
}

// This test process holds at least the 16 MiB it just touched; a pid that
// names no process holds nothing.
func TestResidentBytes(t *testing.T) {
	buf := make([]byte, 16<<20)
	for i := range buf {
		buf[i] = 1
	}
	n, ok := ResidentBytes(os.Getpid())
	if !ok || n < 16<<20 {
		t.Errorf("ResidentBytes of this process: %d, %v; want at least 16 MiB", n, ok)
	}
	runtime.KeepAlive(buf)
	if _, ok := ResidentBytes(0); ok {
		t.Error("ResidentBytes(0) answered")
	}
}

// A program started in a session of its own leads it, and its children are
// members; this process is not.
func TestSession(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	leader := cmd.Process.Pid
	var child int
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tu.Poll(ctx, "the leader's sleep", func() bool {
		for _, pid := range FindAll(func(args []string) bool { return slices.Equal(args, []string{"sleep", "30"}) }) {
			if Session(pid) == leader {
				child = pid
			}
		}
		return child != 0
	}) // a miss is reported below, with what was found

	if Session(leader) != leader || child == 0 {
		t.Errorf("leader %d in session %d, child %d; want the leader's session and its sleep in it", leader, Session(leader), child)
	}
	if Session(os.Getpid()) == leader || Session(0) != 0 {
		t.Errorf("this process in session %d, pid 0 in %d", Session(os.Getpid()), Session(0))
	}
	defer syscall.Kill(child, syscall.SIGKILL)
}
