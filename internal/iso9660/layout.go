package iso9660

import (
	"encoding/binary"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"time"
)

// Image layout (sector numbers):
//
//	0-15   system area, zero
//	16     primary volume descriptor
//	17     volume descriptor set terminator
//	18     type L path table (little-endian)
//	19     type M path table (big-endian)
//	20     SUSP continuation area holding the Rock Ridge ER entry
//	21...  root directory, then each file's contents from a sector boundary
const (
	pvdSector       = 16
	termSector      = 17
	lPathSector     = 18
	mPathSector     = 19
	contSector      = 20
	rootSector      = 21
	pathTableLength = 10 // one entry: the root directory
)

// Rock Ridge announcement (RRIP 1.09, as IEEE P1282 drafts and Linux know
// it). The texts are the identifiers the specification defines.
const (
	erID     = "RRIP_1991A"
	erDesc   = "THE ROCK RIDGE INTERCHANGE PROTOCOL PROVIDES SUPPORT FOR POSIX FILE SYSTEM SEMANTICS"
	erSource = "PLEASE CONTACT DISC PUBLISHER FOR SPECIFICATION SOURCE.  SEE PUBLISHER IDENTIFIER IN PRIMARY VOLUME DESCRIPTOR FOR CONTACT INFORMATION."
)

const (
	flagDirectory = 0x02
	modeDir       = 0o040000 // S_IFDIR
	modeReg       = 0o100000 // S_IFREG
)

type layout struct {
	vol          Volume
	entries      []entry
	rootSectors  uint32
	totalSectors uint32
	dirRecords   [][]byte // ".", "..", then one per entry, in directory order
}

// plan validates v, names and sorts its files and assigns every sector.
func plan(v Volume) (*layout, error) {
	entries, err := validate(v)
	if err != nil {
		return nil, err
	}
	shortNames(entries)
	// Directory records are ordered by identifier (ECMA-119 9.3); level 1
	// identifiers compare correctly as plain strings once split at the dot.
	sortByISOID(entries)
	l := &layout{vol: v, entries: entries}

	// The root directory's size depends only on its records, not on where
	// the files land, so size it first with placeholder extents.
	recs, err := l.records()
	if err != nil {
		return nil, err
	}
	l.rootSectors = packedSectors(recs)
	next := uint32(rootSector) + l.rootSectors
	for i := range l.entries {
		if l.entries[i].size == 0 {
			continue // an empty file has no extent; its location stays 0
		}
		l.entries[i].extent = next
		next += sectors(l.entries[i].size)
	}
	l.totalSectors = next
	if l.dirRecords, err = l.records(); err != nil {
		return nil, err
	}
	return l, nil
}

func sortByISOID(entries []entry) {
	key := func(e entry) (string, string) {
		base, ext, _ := strings.Cut(strings.TrimSuffix(e.isoID, ";1"), ".")
		return base, ext
	}
	sort.SliceStable(entries, func(i, j int) bool {
		bi, ei := key(entries[i])
		bj, ej := key(entries[j])
		return bi < bj || bi == bj && ei < ej
	})
}

// records builds the root directory's records.
func (l *layout) records() ([][]byte, error) {
	t := l.vol.ModTime
	rootSize := l.rootSectors * SectorSize
	dirPX := px(modeDir|0o555, 2)
	// "." carries SP (first, as SUSP requires), then CE pointing at the ER
	// entry, which does not fit in a directory record.
	var dot []byte
	dot = append(dot, 'S', 'P', 7, 1, 0xBE, 0xEF, 0)
	dot = append(dot, ce(contSector, 0, uint32(len(er())))...)
	dot = append(dot, dirPX...)
	dot = append(dot, tf(t)...)
	recs := [][]byte{
		dirRecord([]byte{0}, rootSector, rootSize, t, flagDirectory, dot),
		dirRecord([]byte{1}, rootSector, rootSize, t, flagDirectory, append(append([]byte{}, dirPX...), tf(t)...)),
	}
	for _, e := range l.entries {
		var su []byte
		su = append(su, px(modeReg|uint32(e.mode&fs.ModePerm), 1)...)
		su = append(su, tf(t)...)
		su = append(su, nm(e.file.Name)...)
		r := dirRecord([]byte(e.isoID), e.extent, uint32(e.size), t, 0, su)
		if len(r) > 255 {
			return nil, fmt.Errorf("file %q: directory record is %d bytes, more than 255", e.file.Name, len(r))
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// packedSectors returns the sectors records need when none may cross a
// sector boundary.
func packedSectors(recs [][]byte) uint32 {
	n, used := uint32(1), 0
	for _, r := range recs {
		if used+len(r) > SectorSize {
			n++
			used = 0
		}
		used += len(r)
	}
	return n
}

// header returns every sector before the first file's contents.
func (l *layout) header() []byte {
	b := make([]byte, (rootSector+l.rootSectors)*SectorSize)
	l.putPVD(b[pvdSector*SectorSize:])
	term := b[termSector*SectorSize:]
	term[0] = 255
	copy(term[1:], "CD001")
	term[6] = 1

	lp := b[lPathSector*SectorSize:]
	lp[0] = 1 // identifier length
	binary.LittleEndian.PutUint32(lp[2:], rootSector)
	binary.LittleEndian.PutUint16(lp[6:], 1) // parent: itself
	mp := b[mPathSector*SectorSize:]
	mp[0] = 1
	binary.BigEndian.PutUint32(mp[2:], rootSector)
	binary.BigEndian.PutUint16(mp[6:], 1)

	copy(b[contSector*SectorSize:], er())

	off := rootSector * SectorSize
	used := 0
	for _, r := range l.dirRecords {
		if used+len(r) > SectorSize {
			off += SectorSize - used
			used = 0
		}
		copy(b[off:], r)
		off += len(r)
		used += len(r)
	}
	return b
}

// putPVD fills the primary volume descriptor (ECMA-119 8.4).
func (l *layout) putPVD(p []byte) {
	p[0] = 1
	copy(p[1:6], "CD001")
	p[6] = 1
	putPadded(p[8:40], "LINUX")
	putPadded(p[40:72], l.vol.ID)
	both32(p[80:], l.totalSectors)
	both16(p[120:], 1)          // volume set size
	both16(p[124:], 1)          // volume sequence number
	both16(p[128:], SectorSize) // logical block size
	both32(p[132:], pathTableLength)
	binary.LittleEndian.PutUint32(p[140:], lPathSector)
	binary.BigEndian.PutUint32(p[148:], mPathSector)
	copy(p[156:190], l.dirRecords[0][:34]) // the root's "." record, without its system use
	p[156] = 34
	putPadded(p[190:318], "")              // volume set identifier
	putPadded(p[318:446], "")              // publisher
	putPadded(p[446:574], "")              // data preparer
	putPadded(p[574:702], "AGENT-VM")      // application
	putPadded(p[702:813], "")              // copyright, abstract, bibliographic files
	putLongDate(p[813:830], l.vol.ModTime) // creation
	putLongDate(p[830:847], l.vol.ModTime) // modification
	putLongDate(p[847:864], time.Time{})   // expiration: none
	putLongDate(p[864:881], l.vol.ModTime) // effective
	p[881] = 1                             // file structure version
}

// dirRecord encodes one directory record (ECMA-119 9.1) with its system use
// area.
func dirRecord(id []byte, extent, size uint32, t time.Time, flags byte, su []byte) []byte {
	n := 33 + len(id)
	if len(id)%2 == 0 {
		n++ // padding field
	}
	total := n + len(su)
	if total%2 == 1 {
		total++
	}
	r := make([]byte, total)
	r[0] = byte(total)
	both32(r[2:], extent)
	both32(r[10:], size)
	putShortDate(r[18:25], t)
	r[25] = flags
	both16(r[28:], 1) // volume sequence number
	r[32] = byte(len(id))
	copy(r[33:], id)
	copy(r[n:], su)
	return r
}

// px is the Rock Ridge POSIX attributes entry (RRIP 1.09 form, 36 bytes):
// mode, links, uid 0, gid 0.
func px(mode uint32, links uint32) []byte {
	b := make([]byte, 36)
	copy(b, "PX")
	b[2], b[3] = 36, 1
	both32(b[4:], mode)
	both32(b[12:], links)
	return b
}

// tf is the Rock Ridge timestamps entry: modify, access and attribute change,
// in the 7-byte form.
func tf(t time.Time) []byte {
	b := make([]byte, 5+3*7)
	copy(b, "TF")
	b[2], b[3] = byte(len(b)), 1
	b[4] = 0x02 | 0x04 | 0x08
	for i := 0; i < 3; i++ {
		putShortDate(b[5+7*i:], t)
	}
	return b
}

// nm is the Rock Ridge alternate name entry.
func nm(name string) []byte {
	b := make([]byte, 5, 5+len(name))
	copy(b, "NM")
	b[2], b[3], b[4] = byte(5+len(name)), 1, 0
	return append(b, name...)
}

// ce is the SUSP continuation entry.
func ce(sector, offset, length uint32) []byte {
	b := make([]byte, 28)
	copy(b, "CE")
	b[2], b[3] = 28, 1
	both32(b[4:], sector)
	both32(b[12:], offset)
	both32(b[20:], length)
	return b
}

// er is the SUSP extensions reference entry announcing Rock Ridge.
func er() []byte {
	b := []byte{'E', 'R', byte(8 + len(erID) + len(erDesc) + len(erSource)), 1,
		byte(len(erID)), byte(len(erDesc)), byte(len(erSource)), 1}
	b = append(b, erID...)
	b = append(b, erDesc...)
	return append(b, erSource...)
}

// both16 writes v little-endian then big-endian (ECMA-119 7.2.3).
func both16(b []byte, v uint16) {
	binary.LittleEndian.PutUint16(b, v)
	binary.BigEndian.PutUint16(b[2:], v)
}

// both32 writes v little-endian then big-endian (ECMA-119 7.3.3).
func both32(b []byte, v uint32) {
	binary.LittleEndian.PutUint32(b, v)
	binary.BigEndian.PutUint32(b[4:], v)
}

func putPadded(b []byte, s string) {
	n := copy(b, s)
	for i := n; i < len(b); i++ {
		b[i] = ' '
	}
}

// putShortDate writes the 7-byte recording date (ECMA-119 9.1.5) in UTC.
func putShortDate(b []byte, t time.Time) {
	t = t.UTC()
	b[0] = byte(t.Year() - 1900)
	b[1], b[2] = byte(t.Month()), byte(t.Day())
	b[3], b[4], b[5] = byte(t.Hour()), byte(t.Minute()), byte(t.Second())
	b[6] = 0 // offset from GMT in 15-minute steps
}

// putLongDate writes the 17-byte volume date (ECMA-119 8.4.26.1) in UTC; the
// zero time means "not specified".
func putLongDate(b []byte, t time.Time) {
	if t.IsZero() {
		copy(b, "0000000000000000")
		b[16] = 0
		return
	}
	t = t.UTC()
	copy(b, fmt.Sprintf("%04d%02d%02d%02d%02d%02d%02d",
		t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond()/1e7))
	b[16] = 0
}
