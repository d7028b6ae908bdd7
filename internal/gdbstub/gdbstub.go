// Package gdbstub is a client of QEMU's GDB stub (GDB's remote serial
// protocol) for the one thing agent-vm asks of it: reading and writing a
// stopped guest's physical memory (QEMU's "qemu.PhyMemMode"), which QMP
// cannot write. internal/qemu attaches the stub for the moment of an edit
// on a socket pair QEMU is handed (nothing listens) and removes it after.
//
// Only what that needs is here: packets with checksums and
// acknowledgements, the physical-memory mode, 'm' and 'M'. Replies are
// read one at a time, in order; QEMU sends nothing unasked while the guest
// is stopped.
package gdbstub

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// maxChunk bounds the bytes one 'm' or 'M' packet carries (QEMU's packet
// buffer is 4 KiB of hex).
const maxChunk = 1024

// Conn is one connection to a GDB stub.
type Conn struct {
	conn net.Conn
	r    *bufio.Reader
}

// New speaks the protocol over conn, which is connected to the stub.
func New(conn net.Conn) *Conn {
	return &Conn{conn: conn, r: bufio.NewReader(conn)}
}

// Close closes the connection. QEMU's stub keeps the guest stopped when
// its client goes without detaching.
func (c *Conn) Close() error { return c.conn.Close() }

// Physical makes the stub's memory commands address guest physical
// memory instead of the current CPU's virtual addresses.
func (c *Conn) Physical(ctx context.Context) error {
	reply, err := c.call(ctx, "Qqemu.PhyMemMode:1")
	if err != nil {
		return err
	}
	if reply != "OK" {
		return fmt.Errorf("the GDB stub does not address physical memory (it answered %q to qemu.PhyMemMode)", reply)
	}
	return nil
}

// Read reads n bytes of guest memory at addr.
func (c *Conn) Read(ctx context.Context, addr uint64, n int) ([]byte, error) {
	out := make([]byte, 0, n)
	for len(out) < n {
		k := min(n-len(out), maxChunk)
		at := addr + uint64(len(out))
		reply, err := c.call(ctx, fmt.Sprintf("m%x,%x", at, k))
		if err != nil {
			return nil, err
		}
		if err := stubError(reply); err != nil {
			return nil, fmt.Errorf("reading %d bytes at %#x: %w", k, at, err)
		}
		b, err := hex.DecodeString(reply)
		if err != nil || len(b) != k {
			return nil, fmt.Errorf("reading %d bytes at %#x: the stub answered %q", k, at, clip(reply))
		}
		out = append(out, b...)
	}
	return out, nil
}

// Write writes b into guest memory at addr.
func (c *Conn) Write(ctx context.Context, addr uint64, b []byte) error {
	for done := 0; done < len(b); {
		k := min(len(b)-done, maxChunk)
		at := addr + uint64(done)
		reply, err := c.call(ctx, fmt.Sprintf("M%x,%x:%s", at, k, hex.EncodeToString(b[done:done+k])))
		if err != nil {
			return err
		}
		if err := stubError(reply); err != nil {
			return fmt.Errorf("writing %d bytes at %#x: %w", k, at, err)
		}
		if reply != "OK" {
			return fmt.Errorf("writing %d bytes at %#x: the stub answered %q", k, at, clip(reply))
		}
		done += k
	}
	return nil
}

// stubError is an error reply ("Exx"), or an empty one: a command the
// stub does not know.
func stubError(reply string) error {
	if reply == "" {
		return errors.New("the GDB stub does not support the command")
	}
	if len(reply) == 3 && reply[0] == 'E' {
		if _, err := strconv.ParseUint(reply[1:], 16, 8); err == nil {
			return fmt.Errorf("the GDB stub answered error %s", reply[1:])
		}
	}
	return nil
}

// call sends one packet and returns the stub's reply packet's payload.
func (c *Conn) call(ctx context.Context, payload string) (string, error) {
	// Checked first: deadline's cancellation reaches the connection from
	// another goroutine, which a quick exchange can outrun (seen: a read
	// under an already cancelled context succeeded).
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("gdb stub %s: %w", command(payload), err)
	}
	stop := deadline(ctx, c.conn)
	defer stop()
	reply, err := c.exchange(payload)
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("gdb stub %s: %w", command(payload), ctx.Err())
		}
		return "", fmt.Errorf("gdb stub %s: %w", command(payload), err)
	}
	return reply, nil
}

func (c *Conn) exchange(payload string) (string, error) {
	packet := "$" + payload + "#" + checksum(payload)
	for tries := 0; ; tries++ {
		if _, err := c.conn.Write([]byte(packet)); err != nil {
			return "", err
		}
		ack, err := c.r.ReadByte()
		if err != nil {
			return "", err
		}
		if ack == '+' {
			break
		}
		if ack != '-' || tries == 3 {
			return "", fmt.Errorf("expected an acknowledgement, got %q", ack)
		}
	}
	for {
		reply, ok, err := c.readPacket()
		if err != nil {
			return "", err
		}
		if ok {
			_, err = c.conn.Write([]byte{'+'})
			return reply, err
		}
		if _, err := c.conn.Write([]byte{'-'}); err != nil {
			return "", err
		}
	}
}

// readPacket reads "$payload#xx"; ok is false when the checksum is wrong
// (the stub sends the packet again after a '-').
func (c *Conn) readPacket() (payload string, ok bool, err error) {
	if _, err := c.r.ReadString('$'); err != nil {
		return "", false, err
	}
	body, err := c.r.ReadString('#')
	if err != nil {
		return "", false, err
	}
	body = body[:len(body)-1]
	sum := make([]byte, 2)
	for i := range sum {
		if sum[i], err = c.r.ReadByte(); err != nil {
			return "", false, err
		}
	}
	return body, string(sum) == checksum(body), nil
}

// checksum is the packet's checksum: the sum of its payload's bytes
// modulo 256, as two lowercase hex digits.
func checksum(payload string) string {
	var s byte
	for i := 0; i < len(payload); i++ {
		s += payload[i]
	}
	return fmt.Sprintf("%02x", s)
}

// command names a packet for errors without its data.
func command(payload string) string {
	if i := strings.IndexAny(payload, ":,"); i > 0 && payload[0] != 'Q' {
		return strconv.Quote(payload[:1])
	}
	if i := strings.IndexByte(payload, ':'); i > 0 {
		return strconv.Quote(payload[:i])
	}
	return strconv.Quote(payload)
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// deadline applies ctx to conn: its deadline, and cancellation as an
// immediate one. The returned func undoes both.
func deadline(ctx context.Context, conn net.Conn) func() {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	return func() {
		if stop() {
			_ = conn.SetDeadline(time.Time{})
		}
	}
}
