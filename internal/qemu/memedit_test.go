package qemu

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/qemu/qemutest"
	"github.com/agent-vm/agent-vm/internal/qmp"
)

// editMemory on a real QEMU: a stopped machine without a guest, under
// agent-vm's seccomp policy (and -runas nobody as root, as VMs run), with
// no GDB stub of its own. Each edit is checked through the stub's own
// reads and through QEMU's monitor (HMP xp); the stub is gone after.
func TestEditMemoryOnARealQEMU(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := Hardening{Sandbox: &SandboxPolicy{}}
	if os.Geteuid() == 0 {
		h = Hardening{Sandbox: &SandboxPolicy{AllowSetuid: true}, RunAs: &Owner{UID: 65534, GID: 65534}}
	}
	c := qemutest.Bare(t, ctx, dir, hardeningArgs(h)...)

	id := make([]byte, 16)
	_, _ = rand.Read(id)
	zero := make([]byte, 16)
	edits := []driver.MemoryEdit{
		{What: "a boot id", Addr: 0x3f0008, Old: zero, New: id},
		{What: "a second", Addr: 0x123, Old: zero[:3], New: []byte{1, 2, 3}},
	}
	if err := editMemory(ctx, c, edits); err != nil {
		t.Fatal(err)
	}
	for _, e := range edits {
		if got := xp(t, ctx, c, e.Addr, len(e.New)); !bytes.Equal(got, e.New) {
			t.Errorf("%s: the monitor reads %x at %#x, want %x", e.What, got, e.Addr, e.New)
		}
	}
	noStub(t, ctx, c)

	// An edit whose Old bytes are not there writes nothing and says so;
	// the stub attaches again for it (the first one was removed).
	other := make([]byte, 16)
	_, _ = rand.Read(other)
	err := editMemory(ctx, c, []driver.MemoryEdit{{What: "the boot id", Addr: 0x3f0008, Old: zero, New: other}})
	if err == nil || !strings.Contains(err.Error(), "the boot id at 0x3f0008") || !strings.Contains(err.Error(), "not the template's") {
		t.Fatalf("a mismatched edit: %v", err)
	}
	if got := xp(t, ctx, c, 0x3f0008, 16); !bytes.Equal(got, id) {
		t.Errorf("a refused edit changed the memory: %x, want %x", got, id)
	}
	noStub(t, ctx, c)
	if st, err := c.Status(ctx); err != nil || st == "running" {
		t.Errorf("the machine is %q (%v) after the edits; it must stay stopped until the caller runs it", st, err)
	}
}

// xp reads guest physical memory through QEMU's monitor.
func xp(t *testing.T, ctx context.Context, c *qmp.Client, addr uint64, n int) []byte {
	t.Helper()
	out, err := c.Execute(ctx, "human-monitor-command", map[string]string{"command-line": fmt.Sprintf("xp /%dxb %#x", n, addr)})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, line := range strings.Split(out.String(), "\n") { // "0000000000123458: 0x61 0x67 ..."
		_, rest, _ := strings.Cut(line, ":")
		for _, f := range strings.Fields(rest) {
			var b byte
			if _, err := fmt.Sscanf(f, "0x%x", &b); err == nil {
				got = append(got, b)
			}
		}
	}
	return got
}

// noStub fails unless QEMU's GDB stub's chardev is gone.
func noStub(t *testing.T, ctx context.Context, c *qmp.Client) {
	t.Helper()
	out, err := c.Execute(ctx, "query-chardev", nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.Raw, gdbChardev) {
		t.Errorf("the GDB stub's chardev is still there: %s", out.Raw)
	}
}
