package qmp

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// startQEMU runs a real QEMU with no machine (no guest to boot), just QMP.
func startQEMU(t *testing.T) string {
	t.Helper()
	qemu := tu.Program(t, "qemu-system-x86_64")
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	cmd := exec.Command(qemu, "-machine", "none", "-display", "none", "-nodefaults",
		"-qmp", "unix:"+sock+",server=on,wait=off")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// QEMU creates the socket file (bind) before it listens: a connect in
	// between is refused. Ready is when a connection is accepted, which is
	// what the launcher waits for too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if perr := tu.Poll(ctx, "QEMU's QMP socket to accept a connection", func() bool {
		var c net.Conn
		if c, err = net.Dial("unix", sock); err == nil {
			c.Close()
		}
		return err == nil
	}); perr != nil {
		t.Fatalf("%v: %v", perr, err)
	}
	return sock
}

func TestExecuteAgainstRealQEMU(t *testing.T) {
	sock := startQEMU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Version == "" || c.Version == "0.0.0" {
		t.Errorf("version from greeting: %q", c.Version)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st != "prelaunch" && st != "running" && st != "paused" {
		t.Errorf("status %q", st)
	}
	// stop emits a STOP event before its reply; Execute must skip it.
	if _, err := c.Execute(ctx, "stop", nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.Status(ctx); st != "paused" && st != "prelaunch" {
		t.Errorf("after stop: %q", st)
	}
	ev, err := c.WaitEvent(ctx, "STOP")
	if err != nil || ev.Get("event").String() != "STOP" {
		t.Errorf("STOP event: %v %v", ev, err)
	}
	_, err = c.Execute(ctx, "no-such-command", nil)
	var qe *Error
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Errorf("unknown command: got %v", err)
	}
	if _, err := c.Execute(ctx, "quit", nil); err != nil {
		t.Errorf("quit: %v", err)
	}
}

func TestContextCancelsABlockedWait(t *testing.T) {
	sock := startQEMU(t)
	c, err := Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.WaitEvent(ctx, "NEVER"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want deadline exceeded", err)
	}
}

func TestDialMissingSocket(t *testing.T) {
	_, err := Dial(context.Background(), filepath.Join(t.TempDir(), "nope.sock"))
	if err == nil {
		t.Fatal("dial of a missing socket succeeded")
	}
}
