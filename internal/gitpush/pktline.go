package gitpush

import (
	"errors"
	"fmt"
	"io"
)

// maxPktLen is the largest pkt-line git sends or accepts: the 4 bytes of
// its length and 65516 bytes of data (LARGE_PACKET_MAX in git's pkt-line.h).
const maxPktLen = 65520

// errFlush is what pktReader.next returns for a flush-pkt ("0000").
var errFlush = errors.New("flush-pkt")

// pktReader reads pkt-lines from r one at a time, with no read-ahead: it
// asks r for exactly the bytes of the next pkt-line, so whatever follows
// the last line it read is still unread in r.
type pktReader struct {
	r   io.Reader
	hdr [4]byte
	buf []byte
}

// next returns the data of the next pkt-line (valid until the next call),
// errFlush for a flush-pkt, io.EOF at a clean end (before a length), or an
// error saying what is wrong with the stream.
func (p *pktReader) next() ([]byte, error) {
	if got, err := io.ReadFull(p.r, p.hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("reading a pkt-line length: the stream ends after %d of its 4 bytes", got)
		}
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("reading a pkt-line length: %w", err)
	}
	n, err := pktLen(p.hdr)
	if err != nil {
		return nil, err
	}
	switch {
	case n == 0:
		return nil, errFlush
	case n < 4:
		// 0001 and 0002 are protocol v2's delimiter and response-end
		// packets, which a receive-pack request never carries; 0003 is
		// never valid.
		return nil, fmt.Errorf("pkt-line length %q is not valid in a push request (only 0000 or 0004 to %04x)", p.hdr[:], maxPktLen)
	case n > maxPktLen:
		return nil, fmt.Errorf("pkt-line length %q is over git's maximum of %04x", p.hdr[:], maxPktLen)
	}
	if cap(p.buf) < n-4 {
		p.buf = make([]byte, n-4, maxPktLen-4)
	}
	p.buf = p.buf[:n-4]
	if _, err := io.ReadFull(p.r, p.buf); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("reading a pkt-line of %d bytes: the stream ends before its end", n)
		}
		return nil, fmt.Errorf("reading a pkt-line of %d bytes: %w", n, err)
	}
	return p.buf, nil
}

// pktLen decodes a pkt-line's 4 hex digit length (either case, as git's
// own decoder accepts).
func pktLen(hdr [4]byte) (int, error) {
	n := 0
	for _, c := range hdr {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, fmt.Errorf("pkt-line length %q is not 4 hex digits: is this a git push request?", hdr[:])
		}
		n = n<<4 | int(d)
	}
	return n, nil
}

// appendPkt appends data as one pkt-line (data must fit: at most
// maxPktLen-4 bytes).
func appendPkt(dst, data []byte) []byte {
	dst = fmt.Appendf(dst, "%04x", len(data)+4)
	return append(dst, data...)
}
