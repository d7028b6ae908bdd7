package qemu

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/gdbstub"
	"github.com/agent-vm/agent-vm/internal/qmp"
)

// gdbChardev is the chardev QEMU's GDB stub is attached to while
// editMemory runs.
const gdbChardev = "agentvm-gdb"

// editMemory makes edits in a stopped guest's memory. QMP reads guest
// memory but cannot write it; QEMU's GDB stub can, in its physical-memory
// mode. The stub is attached only for the edits, to one end of a socket
// pair QEMU is handed over QMP (no socket file, nothing listens: QEMU
// under -runas could not open one in the VM's directories anyway), and
// removed after. Each edit checks that the memory holds its Old bytes
// before it writes, and reads the New ones back; a mismatch writes
// nothing more. The guest stays stopped throughout (the stub stops it
// when its client connects, and a client that goes without detaching
// leaves it so); the caller's cont runs it.
func editMemory(ctx context.Context, c *qmp.Client, edits []driver.MemoryEdit) (err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("editing the guest's memory: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "gdb"), os.NewFile(uintptr(fds[1]), "gdb-qemu")
	defer ours.Close()
	err = c.SendFD(ctx, gdbChardev, theirs)
	theirs.Close()
	if err != nil {
		return fmt.Errorf("editing the guest's memory: %w", err)
	}
	chardev := map[string]any{"id": gdbChardev, "backend": map[string]any{"type": "socket", "data": map[string]any{
		"server": false, "addr": map[string]any{"type": "fd", "data": map[string]string{"str": gdbChardev}}}}}
	if _, err := c.Execute(ctx, "chardev-add", chardev); err != nil {
		return fmt.Errorf("editing the guest's memory: %w", err)
	}
	if err := hmp(ctx, c, "gdbserver chardev:"+gdbChardev, "Waiting for gdb connection"); err != nil {
		_, _ = c.Execute(ctx, "chardev-remove", map[string]string{"id": gdbChardev})
		return fmt.Errorf("editing the guest's memory: attaching QEMU's GDB stub: %w", err)
	}
	defer func() {
		// "none" detaches the stub and deletes its chardev.
		if derr := hmp(ctx, c, "gdbserver none", "Disabled gdbserver"); derr != nil && err == nil {
			err = fmt.Errorf("editing the guest's memory: detaching QEMU's GDB stub: %w", derr)
		}
	}()
	conn, err := net.FileConn(ours)
	if err != nil {
		return fmt.Errorf("editing the guest's memory: %w", err)
	}
	g := gdbstub.New(conn)
	defer g.Close()
	if err := g.Physical(ctx); err != nil {
		return fmt.Errorf("editing the guest's memory: %w", err)
	}
	for _, e := range edits {
		if err := applyEdit(ctx, g, e); err != nil {
			return fmt.Errorf("editing the guest's memory (%s at %#x): %w", e.What, e.Addr, err)
		}
	}
	return nil
}

// applyEdit makes one edit: Old must be there, New is read back.
func applyEdit(ctx context.Context, g *gdbstub.Conn, e driver.MemoryEdit) error {
	if len(e.Old) != len(e.New) || len(e.New) == 0 {
		return fmt.Errorf("internal error: an edit of %d bytes by %d", len(e.Old), len(e.New))
	}
	got, err := g.Read(ctx, e.Addr, len(e.Old))
	if err != nil {
		return err
	}
	if !bytes.Equal(got, e.Old) {
		return fmt.Errorf("the memory holds %x there, not the template's %x", got, e.Old)
	}
	if err := g.Write(ctx, e.Addr, e.New); err != nil {
		return err
	}
	got, err = g.Read(ctx, e.Addr, len(e.New))
	if err != nil {
		return err
	}
	if !bytes.Equal(got, e.New) {
		return fmt.Errorf("wrote %x and read back %x", e.New, got)
	}
	return nil
}

// hmp runs a human monitor command; HMP reports most failures as text
// rather than as a QMP error, so an answer that does not begin with ok is
// one.
func hmp(ctx context.Context, c *qmp.Client, line, ok string) error {
	out, err := c.Execute(ctx, "human-monitor-command", map[string]string{"command-line": line})
	if err != nil {
		return err
	}
	if s := out.String(); !strings.HasPrefix(s, ok) {
		return fmt.Errorf("QEMU's monitor answered %q to %q", s, line)
	}
	return nil
}
