// Package logtail shows a VM's logs as `agent-vm logs` does (Show): the
// serial console's file and the guest's logs, the last lines of each and
// then what is appended (Follow), each line prefixed with its source and
// escaped for a terminal (PrefixWriter, which several goroutines may
// write to at once).
package logtail

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Follow writes the last n lines of path, then what is appended, until
// ctx ends. A file replaced by a new one (a restart rotates the console
// log) is followed from its start.
func Follow(ctx context.Context, path string, n int, out io.Writer) error {
	if tail := driver.TailFile(path, n); tail != "" {
		fmt.Fprintln(out, tail)
	}
	f, err := os.Open(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	var off int64
	if f != nil {
		off, _ = f.Seek(0, io.SeekEnd)
	}
	buf := make([]byte, 32<<10)
	for {
		if f != nil {
			for {
				k, rerr := f.ReadAt(buf, off)
				if k > 0 {
					out.Write(buf[:k])
					off += int64(k)
				}
				if rerr != nil || k == 0 {
					break
				}
			}
			if replaced(f, path, off) {
				f.Close()
				f, off = nil, 0
			}
		}
		if f == nil {
			if nf, err := os.Open(path); err == nil {
				f = nf
			}
		}
		select {
		case <-ctx.Done():
			if f != nil {
				f.Close()
			}
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// replaced reports whether path now names another file than f, or f shrank.
func replaced(f *os.File, path string, off int64) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	if err1 != nil || err2 != nil {
		return err2 == nil
	}
	return !os.SameFile(a, b) || a.Size() < off
}

// PrefixWriter prefixes every line, escapes it for a terminal (the guest
// wrote it) and serialises writers sharing Mu. A last line without a
// newline waits for Flush.
type PrefixWriter struct {
	W      io.Writer
	Prefix string
	Mu     *sync.Mutex
	part   []byte
}

func (p *PrefixWriter) Write(b []byte) (int, error) {
	p.Mu.Lock()
	defer p.Mu.Unlock()
	p.part = append(p.part, b...)
	for {
		i := bytes.IndexByte(p.part, '\n')
		if i < 0 {
			break
		}
		line := termsafe.Line(string(p.part[:i]))
		if _, err := fmt.Fprintf(p.W, "%s%s\n", p.Prefix, line); err != nil {
			return 0, err
		}
		p.part = p.part[i+1:]
	}
	return len(b), nil
}

// Flush writes a last line that has no newline yet.
func (p *PrefixWriter) Flush() error {
	p.Mu.Lock()
	defer p.Mu.Unlock()
	if len(p.part) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(p.W, "%s%s\n", p.Prefix, termsafe.Line(string(p.part)))
	p.part = nil
	return err
}
