package qemu

import (
	"bytes"
	"encoding/binary"
	"io"
	"maps"
	"testing"
)

// stream builds a migration stream as QEMU 7.2's savevm.c and ram.c
// write one (see copyWithoutZeroPages).
type stream struct{ bytes.Buffer }

func (s *stream) be32(v uint32) { _ = binary.Write(&s.Buffer, binary.BigEndian, v) }
func (s *stream) be64(v uint64) { _ = binary.Write(&s.Buffer, binary.BigEndian, v) }
func (s *stream) str(v string)  { s.WriteByte(byte(len(v))); s.WriteString(v) }

func (s *stream) header() {
	s.be32(streamMagic)
	s.be32(streamVersion)
	s.WriteByte(secConfig)
	s.be32(10)
	s.WriteString("pc-q35-7.2")
}

func (s *stream) start(id uint32, blocks map[string]uint64, order []string) {
	s.WriteByte(secStart)
	s.be32(id)
	s.str("ram")
	s.be32(0) // instance
	s.be32(4) // version
	var total uint64
	for _, b := range order {
		total += blocks[b]
	}
	s.be64(total | ramMemSize)
	for _, b := range order {
		s.str(b)
		s.be64(blocks[b])
	}
}

func (s *stream) part(kind byte, id uint32) { s.WriteByte(kind); s.be32(id) }
func (s *stream) eos(id uint32) {
	s.be64(ramEOS)
	s.WriteByte(secFooter)
	s.be32(id)
}

// zero and page write a record; block "" continues the block before.
func (s *stream) zero(block string, addr uint64, fill byte) {
	s.record(block, addr, ramZero)
	s.WriteByte(fill)
}
func (s *stream) page(block string, addr uint64, data byte) {
	s.record(block, addr, ramPage)
	s.Write(bytes.Repeat([]byte{data}, pageSize))
}
func (s *stream) record(block string, addr, flags uint64) {
	if block == "" {
		s.be64(addr | flags | ramContinue)
		return
	}
	s.be64(addr | flags)
	s.str(block)
}

// load is what QEMU makes of a stream's RAM records: each block's pages
// on fresh (zero) memory, how many zero records it read, and the bytes
// after the RAM (the devices' sections), which it does not parse.
func load(t *testing.T, b []byte) (mem map[string]map[uint64]byte, zeros int, rest []byte) {
	t.Helper()
	r := bytes.NewReader(b)
	var hdr [8]byte
	_, _ = io.ReadFull(r, hdr[:])
	mem = map[string]map[uint64]byte{}
	cur := ""
	for {
		kind, err := r.ReadByte()
		if err != nil {
			t.Fatal("no EOF section")
		}
		switch kind {
		case secConfig:
			var n uint32
			_ = binary.Read(r, binary.BigEndian, &n)
			_, _ = r.Seek(int64(n), io.SeekCurrent)
			continue
		case secStart:
			_, _ = r.Seek(4, io.SeekCurrent)
			n, _ := r.ReadByte()
			_, _ = r.Seek(int64(n)+8, io.SeekCurrent)
		case secPart, secEnd:
			_, _ = r.Seek(4, io.SeekCurrent)
		default:
			_ = r.UnreadByte()
			rest, _ = io.ReadAll(r)
			return mem, zeros, rest
		}
		for {
			var v uint64
			if err := binary.Read(r, binary.BigEndian, &v); err != nil {
				t.Fatalf("a RAM part ends without EOS: %v", err)
			}
			flags, addr := v&(pageSize-1), v&^uint64(pageSize-1)
			if flags == ramEOS {
				break
			}
			if flags == ramMemSize {
				for left := addr; left > 0; {
					n, _ := r.ReadByte()
					name := make([]byte, n)
					_, _ = io.ReadFull(r, name)
					var l uint64
					_ = binary.Read(r, binary.BigEndian, &l)
					mem[string(name)] = map[uint64]byte{}
					left -= l
				}
				continue
			}
			if flags&ramContinue == 0 {
				n, _ := r.ReadByte()
				name := make([]byte, n)
				_, _ = io.ReadFull(r, name)
				cur = string(name)
			} else if cur == "" {
				t.Fatalf("a record at %#x continues no block", addr)
			}
			switch flags &^ ramContinue {
			case ramZero:
				fill, _ := r.ReadByte()
				zeros++
				mem[cur][addr] = fill
			case ramPage:
				data := make([]byte, pageSize)
				_, _ = io.ReadFull(r, data)
				mem[cur][addr] = data[0]
			default:
				t.Fatalf("record flags %#x", flags)
			}
		}
		if k, _ := r.ReadByte(); k == secFooter {
			_, _ = r.Seek(4, io.SeekCurrent)
		} else {
			_ = r.UnreadByte()
		}
	}
}

// nonzero is a memory less its zero pages: what a load on fresh memory
// leaves whatever the zero records.
func nonzero(mem map[string]map[uint64]byte) map[string]map[uint64]byte {
	out := map[string]map[uint64]byte{}
	for b, pages := range mem {
		out[b] = map[uint64]byte{}
		for a, v := range pages {
			if v != 0 {
				out[b][a] = v
			}
		}
	}
	return out
}

func filtered(t *testing.T, in []byte) ([]byte, int64) {
	t.Helper()
	var out bytes.Buffer
	n, err := copyWithoutZeroPages(&out, bytes.NewReader(in), guestRAM)
	if err != nil {
		t.Fatal(err)
	}
	return out.Bytes(), n
}

func TestCopyWithoutZeroPages(t *testing.T) {
	var s stream
	s.header()
	blocks := map[string]uint64{guestRAM: 64 * pageSize, "pc.rom": 4 * pageSize}
	s.start(2, blocks, []string{guestRAM, "pc.rom"})
	s.eos(2)
	s.part(secPart, 2)
	s.zero(guestRAM, 0, 0)          // the first of the part, naming the block: left out
	s.page("", 1*pageSize, 0x11)    // continues it: must name it now
	s.zero("", 2*pageSize, 0)       // left out
	s.zero("", 3*pageSize, 0x5a)    // a fill that is not zero: kept
	s.zero("pc.rom", 0, 0)          // a ROM's zero page: kept (QEMU filled it from its file)
	s.zero(guestRAM, 4*pageSize, 0) // left out, naming the block again
	s.page("", 5*pageSize, 0x22)    // must name it: the last record written was the ROM's
	s.eos(2)
	s.part(secPart, 2)
	s.zero(guestRAM, 1*pageSize, 0) // sent with data before: cleared since, kept
	s.zero("", 6*pageSize, 0)       // left out
	s.eos(2)
	s.part(secEnd, 2)
	s.page(guestRAM, 7*pageSize, 0x33)
	s.eos(2)
	// A device's section (its bytes not parsed: one looks like a RAM part)
	// and EOF, copied as they are.
	device := []byte{secFull, 0, 0, 0, 9, 3, 'd', 'e', 'v', 0, 0, 0, 0, 0, 0, 0, 1, secPart, 0, 0, 0, 2, 0x7f, secFooter, 0, 0, 0, 9, 0x1f}
	s.Write(device)
	in := s.Bytes()

	out, dropped := filtered(t, in)
	if dropped != 4 {
		t.Errorf("left out %d zero pages, want 4", dropped)
	}
	memIn, zerosIn, restIn := load(t, in)
	memOut, zerosOut, restOut := load(t, out)
	if zerosOut != zerosIn-4 {
		t.Errorf("zero records: %d in, %d out", zerosIn, zerosOut)
	}
	if !bytes.Equal(restIn, device) || !bytes.Equal(restOut, device) {
		t.Errorf("the devices' sections: got %v, want %v", restOut, device)
	}
	a, b := nonzero(memIn), nonzero(memOut)
	for blk := range maps.Keys(a) {
		if !maps.Equal(a[blk], b[blk]) {
			t.Errorf("block %s loads as %v, want %v", blk, b[blk], a[blk])
		}
	}
	if _, ok := memOut["pc.rom"][0]; !ok {
		t.Error("the ROM's zero page was left out")
	}
	if v, ok := memOut[guestRAM][1*pageSize]; !ok || v != 0 {
		t.Errorf("a page sent with data, then as zeros: got %#x, %v; want it cleared", v, ok)
	}
	// What QEMU reads is a stream this filters alike again.
	if again, n := filtered(t, out); n != 0 || !bytes.Equal(again, out) {
		t.Errorf("filtering the output again left out %d more", n)
	}
}

// What it does not know it copies as it is: another stream, a record
// of a kind it does not filter (from there on), a section of another
// iterable device.
func TestCopyWithoutZeroPagesLeavesWhatItDoesNotKnow(t *testing.T) {
	blocks := map[string]uint64{guestRAM: 8 * pageSize}
	for name, build := range map[string]func(s *stream){
		"not a migration stream": func(s *stream) { s.WriteString("QEVX and then some bytes") },
		"a compressed page": func(s *stream) {
			s.header()
			s.start(2, blocks, []string{guestRAM})
			s.be64(0x100) // RAM_SAVE_FLAG_COMPRESS_PAGE, named
			s.str(guestRAM)
			s.be32(3)
			s.WriteString("abc")
			s.zero("", pageSize, 0)
			s.eos(2)
			s.WriteByte(0x1f)
		},
		"another iterable section first": func(s *stream) {
			s.header()
			s.WriteByte(secStart)
			s.be32(1)
			s.str("block")
			s.be32(0)
			s.be32(1)
			s.zero(guestRAM, 0, 0)
			s.WriteByte(0x1f)
		},
		"cut short": func(s *stream) { s.header(); s.WriteByte(secStart) },
	} {
		t.Run(name, func(t *testing.T) {
			var s stream
			build(&s)
			in := s.Bytes()
			out, n := filtered(t, in)
			if n != 0 || !bytes.Equal(out, in) {
				t.Errorf("left out %d, changed %v", n, !bytes.Equal(out, in))
			}
		})
	}
}

// A stream that ends inside a RAM part is an error (QEMU would fail to
// load it too), with what it could copy copied.
func TestCopyWithoutZeroPagesTruncated(t *testing.T) {
	var s stream
	s.header()
	s.start(2, map[string]uint64{guestRAM: 8 * pageSize}, []string{guestRAM})
	s.eos(2)
	s.part(secPart, 2)
	s.page(guestRAM, 0, 1)
	in := s.Bytes()[:s.Len()-100]
	var out bytes.Buffer
	if _, err := copyWithoutZeroPages(&out, bytes.NewReader(in), guestRAM); err == nil {
		t.Fatal("no error for a stream cut inside a page")
	}
}
