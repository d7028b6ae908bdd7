package qemu

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// guestRAM is the id of the guest's RAM backend (argv), which is also
// its RAM block's name in a migration stream.
const guestRAM = "agentvm-mem"

// copyWithoutZeroPages copies a saved state (a QEMU 7.2 migration stream
// that holds the guest's RAM: one saved before the RAM was saved apart,
// or where agent-vm could not open the memfd) from src to dst less the
// records of block's pages that are all zeros and were not sent with data
// before in the stream.
//
// Why: loading a zero-page record, QEMU 7.2 reads the destination page to
// see whether it must clear it (ram_handle_compressed), and a read of a
// page of a fresh memfd (the guest's RAM, share=on for virtiofsd)
// allocates it. A saved 4 GiB guest that used 350 MiB is 3.7 GiB of such
// records, so every restore (a clone of a template, a resume) made its
// QEMU hold the guest's whole memory and took 15-25 s under load instead
// of about one. The destination's RAM is fresh, all zeros, so leaving a
// zero page out loads the same memory; the ROM blocks are left whole
// (QEMU fills them from its files before the load).
//
// The stream is read as savevm.c and ram.c of QEMU 7.2 write it without
// migration capabilities: the header, the configuration section, the RAM
// section's START, PART and END parts (each a list of page records ending
// in EOS, and the section footer), then the devices' FULL sections and
// EOF, which are copied as they are. Anything else, from where it is met
// (another iterable section, a command, a record it does not know), is
// copied as it is too, so the result is always a stream QEMU loads: at
// worst with fewer records left out. It returns how many it left out.
func copyWithoutZeroPages(dst io.Writer, src io.Reader, block string) (dropped int64, err error) {
	r := bufio.NewReaderSize(src, 1<<20)
	w := bufio.NewWriterSize(dst, 1<<20)
	z := zeroFilter{r: r, w: w, block: block, sent: map[uint64]bool{}}
	if err := z.run(); err != nil {
		return z.dropped, err
	}
	if _, err := io.Copy(w, r); err != nil { // what it left to copy as it is
		return z.dropped, err
	}
	return z.dropped, w.Flush()
}

// Migration stream constants of QEMU 7.2 (migration/savevm.c, ram.c).
const (
	streamMagic   = 0x5145564d // "QEVM"
	streamVersion = 3

	secStart  = 0x01
	secPart   = 0x02
	secEnd    = 0x03
	secFull   = 0x04
	secConfig = 0x07
	secFooter = 0x7e

	ramZero     = 0x02
	ramMemSize  = 0x04
	ramPage     = 0x08
	ramEOS      = 0x10
	ramContinue = 0x20

	pageSize = 4096 // x86's TARGET_PAGE_SIZE: the low bits of a record's address are its flags
)

// errVerbatim stops the filtering: the rest of the stream is copied as it
// is (not an error).
var errVerbatim = errors.New("the rest as it is")

type zeroFilter struct {
	r     *bufio.Reader
	w     *bufio.Writer
	block string
	// ramID is the RAM section's id, from its START part (haveRAM).
	ramID   uint32
	haveRAM bool
	// cur is the block the reader's records refer to; curOut the one the
	// records written so far leave QEMU at (a left-out record that named
	// its block makes the next written one name it).
	cur, curOut string
	// sent are block's pages written with data, by offset: a zero record
	// for one of them is kept (the page was cleared after).
	sent    map[uint64]bool
	dropped int64
}

// run filters until the first thing it does not filter, leaving the
// reader there; errVerbatim is no error.
func (z *zeroFilter) run() error {
	head, err := z.r.Peek(8)
	if err != nil || binary.BigEndian.Uint32(head[:4]) != streamMagic || binary.BigEndian.Uint32(head[4:]) != streamVersion {
		return nil // not a stream this knows: copied as it is
	}
	if err := z.copyN(8); err != nil {
		return err
	}
	for {
		err := z.section()
		if errors.Is(err, errVerbatim) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// section filters one section of the RAM, or the configuration; at any
// other it returns errVerbatim without reading it.
func (z *zeroFilter) section() error {
	b, err := z.r.Peek(1)
	if err != nil {
		return errVerbatim // the end: nothing left (or nothing readable) to copy
	}
	switch b[0] {
	case secConfig:
		// The machine type, a be32-sized string; a subsection after it
		// (capabilities set) is not this stream's.
		hdr, err := z.r.Peek(5)
		if err != nil {
			return errVerbatim
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > 256 {
			return errVerbatim
		}
		return z.copyN(5 + int(n))
	case secStart:
		hdr, err := z.r.Peek(6)
		if err != nil {
			return errVerbatim
		}
		n := int(hdr[5])
		hdr, err = z.r.Peek(6 + n + 8)
		if err != nil || string(hdr[6:6+n]) != "ram" {
			return errVerbatim
		}
		z.ramID, z.haveRAM = binary.BigEndian.Uint32(hdr[1:5]), true
		if err := z.copyN(6 + n + 8); err != nil {
			return err
		}
	case secPart, secEnd:
		hdr, err := z.r.Peek(5)
		if err != nil || !z.haveRAM || binary.BigEndian.Uint32(hdr[1:]) != z.ramID {
			return errVerbatim
		}
		if err := z.copyN(5); err != nil {
			return err
		}
	default: // a device's FULL section, EOF, a command: as it is
		return errVerbatim
	}
	if err := z.records(); err != nil {
		return err
	}
	// The section footer, when the stream has them.
	if b, err := z.r.Peek(1); err == nil && b[0] == secFooter {
		return z.copyN(5)
	}
	return nil
}

// records filters a RAM part's page records up to its EOS.
func (z *zeroFilter) records() error {
	for {
		var a [8]byte
		if _, err := io.ReadFull(z.r, a[:]); err != nil {
			return readErr(err)
		}
		v := binary.BigEndian.Uint64(a[:])
		flags, addr := v&(pageSize-1), v&^uint64(pageSize-1)
		switch {
		case flags == ramMemSize:
			// The block list: addr is the blocks' total length.
			if _, err := z.w.Write(a[:]); err != nil {
				return err
			}
			for left := addr; left > 0; {
				name, err := z.name()
				if err != nil {
					return err
				}
				var l [8]byte
				if _, err := io.ReadFull(z.r, l[:]); err != nil {
					return readErr(err)
				}
				n := binary.BigEndian.Uint64(l[:])
				if n > left {
					return fmt.Errorf("the saved state's RAM blocks add up to more than it says (%d)", addr)
				}
				left -= n
				if err := z.writeName(name); err != nil {
					return err
				}
				if _, err := z.w.Write(l[:]); err != nil {
					return err
				}
			}
			continue
		case flags == ramEOS:
			_, err := z.w.Write(a[:])
			return err
		case flags&^ramContinue == ramZero, flags&^ramContinue == ramPage:
		default:
			// A record of another kind (compressed, XBZRLE, a hook):
			// from here on as it is.
			if _, err := z.w.Write(a[:]); err != nil {
				return err
			}
			return errVerbatim
		}
		if flags&ramContinue == 0 {
			name, err := z.name()
			if err != nil {
				return err
			}
			z.cur = name
		}
		var fill byte
		var data []byte
		if flags&ramZero != 0 {
			c, err := z.r.ReadByte()
			if err != nil {
				return readErr(err)
			}
			fill = c
		} else {
			d, err := z.r.Peek(pageSize)
			if err != nil {
				return readErr(err)
			}
			data = d
		}
		ours := z.cur == z.block
		if flags&ramZero != 0 && fill == 0 && ours && !z.sent[addr] {
			z.dropped++
			continue
		}
		if ours && data != nil {
			z.sent[addr] = true
		}
		// Written: naming its block when the records written so far
		// leave QEMU at another.
		out := v
		if z.cur != z.curOut {
			out &^= ramContinue
		}
		binary.BigEndian.PutUint64(a[:], out)
		if _, err := z.w.Write(a[:]); err != nil {
			return err
		}
		if out&ramContinue == 0 {
			if err := z.writeName(z.cur); err != nil {
				return err
			}
		}
		z.curOut = z.cur
		if data != nil {
			if _, err := z.w.Write(data); err != nil {
				return err
			}
			if _, err := z.r.Discard(pageSize); err != nil {
				return err
			}
		} else if err := z.w.WriteByte(fill); err != nil {
			return err
		}
	}
}

// name reads a RAM block's name as the stream has it: its length in a
// byte, then its bytes.
func (z *zeroFilter) name() (string, error) {
	n, err := z.r.ReadByte()
	if err != nil {
		return "", readErr(err)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(z.r, b); err != nil {
		return "", readErr(err)
	}
	return string(b), nil
}

// writeName writes a RAM block's name as name reads it.
func (z *zeroFilter) writeName(name string) error {
	if err := z.w.WriteByte(byte(len(name))); err != nil {
		return err
	}
	_, err := z.w.WriteString(name)
	return err
}

// readErr is a read of the saved state that failed (it ended early).
func readErr(err error) error { return fmt.Errorf("reading the saved state: %w", err) }

// copyN copies n bytes as they are.
func (z *zeroFilter) copyN(n int) error {
	_, err := io.CopyN(z.w, z.r, int64(n))
	return err
}
