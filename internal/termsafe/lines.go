package termsafe

import (
	"bytes"
	"io"
	"sync"
)

// LineWriter passes a program's output on a line at a time, each made safe
// by Line, with progress that the program redraws in place collapsed:
// vagrant (box add, up) rewrites "Progress: 12%" after a carriage return
// thousands of times, which a log or a pipe would keep in full. Of the
// parts of a line that carriage returns separate, only the last is
// written, after the last overwritten part that was not blank (the final
// state of the progress, "Progress: 100%") on a line of its own. Close
// writes an unterminated last line.
type LineWriter struct {
	mu   sync.Mutex
	w    io.Writer
	line []byte // the current part of the current line
	prev []byte // the last non-blank part a carriage return ended
	cr   bool   // the last byte was a carriage return
}

// NewLineWriter returns a LineWriter writing to w.
func NewLineWriter(w io.Writer) *LineWriter { return &LineWriter{w: w} }

// Write takes any part of the output; it writes whole lines to w.
func (l *LineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range p {
		switch {
		case c == '\n':
			if err := l.flush(); err != nil {
				return 0, err
			}
			continue
		case l.cr:
			// A carriage return not ending the line: what follows
			// overwrites the part before it.
			if part := Line(string(l.line)); part != "" {
				l.prev = append(l.prev[:0], part...)
			}
			l.line = l.line[:0]
		}
		l.cr = c == '\r'
		if !l.cr {
			l.line = append(l.line, c)
		}
	}
	return len(p), nil
}

// flush writes the current line and starts the next.
func (l *LineWriter) flush() error {
	var out bytes.Buffer
	last := Line(string(l.line))
	if len(l.prev) > 0 {
		out.Write(l.prev)
		out.WriteByte('\n')
	}
	if last != "" || len(l.prev) == 0 {
		out.WriteString(last)
		out.WriteByte('\n')
	}
	l.line, l.prev, l.cr = l.line[:0], l.prev[:0], false
	_, err := l.w.Write(out.Bytes())
	return err
}

// Close writes what is left of an unterminated last line.
func (l *LineWriter) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.line) == 0 && len(l.prev) == 0 {
		return nil
	}
	return l.flush()
}
