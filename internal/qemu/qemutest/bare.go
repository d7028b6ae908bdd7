package qemutest

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/qmp"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// Bare starts a REAL QEMU (not the fake above) with no guest: a stopped
// q35 machine with 64 MiB under TCG, its QMP on qmp.sock in dir, and args
// added to its command line. It is killed when the test ends; the QMP
// client it returns is closed then too. For tests of what QEMU itself does
// with its memory and its monitors (the GDB stub, memory edits).
func Bare(t testing.TB, ctx context.Context, dir string, args ...string) *qmp.Client {
	t.Helper()
	bin := testutil.Program(t, "qemu-system-x86_64")
	sock := filepath.Join(dir, "qmp.sock")
	argv := append([]string{"-machine", "q35", "-accel", "tcg", "-m", "64", "-nodefaults", "-display", "none", "-S",
		"-qmp", "unix:" + sock + ",server=on,wait=off"}, args...)
	cmd := exec.CommandContext(ctx, bin, argv...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		c, err := qmp.Dial(ctx, sock)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		if ctx.Err() != nil {
			t.Fatalf("QEMU's QMP never answered: %v; QEMU said: %s", err, stderr.String())
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}
