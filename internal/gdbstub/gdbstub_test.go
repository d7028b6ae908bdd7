package gdbstub_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/gdbstub"
	"github.com/agent-vm/agent-vm/internal/qemu/qemutest"
)

// A real QEMU (a stopped machine with 64 MiB and no guest) serves its GDB
// stub on a unix socket; the client writes physical memory, and QEMU's own
// monitor (HMP xp, another path into the same memory) reads it back.
func TestPhysicalMemoryRoundTrip(t *testing.T) {
	dir := t.TempDir()
	gdbSock := filepath.Join(dir, "gdb.sock")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := qemutest.Bare(t, ctx, dir, "-chardev", "socket,id=gdb,path="+gdbSock+",server=on,wait=off", "-gdb", "chardev:gdb")
	conn, err := net.Dial("unix", gdbSock)
	if err != nil {
		t.Fatal(err)
	}
	g := gdbstub.New(conn)
	defer g.Close()
	if err := g.Physical(ctx); err != nil {
		t.Fatal(err)
	}

	const addr = 0x123458 // not page-aligned, in RAM
	want := []byte("agent-vm boot id\x00\xff\x10")
	if err := g.Write(ctx, addr, want); err != nil {
		t.Fatal(err)
	}
	got, err := g.Read(ctx, addr, len(want))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read back %q, want %q", got, want)
	}
	out, err := q.Execute(ctx, "human-monitor-command", map[string]string{"command-line": "xp /19xb 0x123458"})
	if err != nil {
		t.Fatal(err)
	}
	var seen []byte // xp prints "0000000000123458: 0x61 0x67 ..." lines
	for _, line := range strings.Split(out.String(), "\n") {
		_, rest, _ := strings.Cut(line, ":")
		for _, m := range regexp.MustCompile(`0x([0-9a-f]{2})\b`).FindAllStringSubmatch(rest, -1) {
			b, _ := hex.DecodeString(m[1])
			seen = append(seen, b...)
		}
	}
	if !bytes.Equal(seen, want) {
		t.Fatalf("QEMU's monitor sees %x at %#x, want %x (xp said %q)", seen, addr, want, out.String())
	}

	// Large reads and writes go in several packets.
	big := bytes.Repeat([]byte{0xa5, 0x5a, 0x00}, 1500)
	if err := g.Write(ctx, 0x200000, big); err != nil {
		t.Fatal(err)
	}
	if got, err := g.Read(ctx, 0x200000, len(big)); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("a %d-byte round trip: err %v, equal %v", len(big), err, bytes.Equal(got, big))
	}

	// The stub stays stopped: the machine never ran.
	if st, err := q.Status(ctx); err != nil || st == "running" {
		t.Fatalf("status %q, %v; want stopped", st, err)
	}

	// A cancelled context ends a call at once, naming the command.
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := g.Read(cctx, addr, 4); err == nil || !strings.Contains(err.Error(), `"m"`) {
		t.Fatalf("read under a cancelled context: %v", err)
	}
}
