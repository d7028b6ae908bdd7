package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// LogsOptions are logs' inputs.
type LogsOptions struct {
	Follow bool
	Lines  int // how many lines of each log to show first; 0 = 200
}

// Logs writes the VM's serial console and, when the VM runs, the guest's
// provisioning log (the repository's packages and provision.sh) and
// agent-mcp's journal. With Follow it keeps writing them as they grow, each
// line prefixed with its source, until ctx ends.
//
// The guest writes both, so every line is escaped (termsafe.Line: colours
// dropped, other control characters shown as \x1b ...), whether or not out
// is a terminal: `agent-vm logs | grep` reaches one too. The raw bytes are
// in the console log file the header names.
func (m *Manager) Logs(ctx context.Context, name string, o LogsOptions, out io.Writer) error {
	e, err := m.findRecorded(ctx, name)
	if err != nil {
		return err
	}
	if o.Lines <= 0 {
		o.Lines = 200
	}
	d, err := m.driverOf(e.Record)
	if err != nil {
		return err
	}
	console := d.Logs(m.machine(e.Record, e.Layout)).Console
	running := m.Status(ctx, e, false).State == StateRunning
	journal := fmt.Sprintf("sudo journalctl -u agent-mcp --no-pager --output=short-iso -n %d", o.Lines)
	if !o.Follow {
		fmt.Fprintf(out, "==> serial console (%s) <==\n", console)
		safe := &prefixWriter{w: out, mu: &sync.Mutex{}}
		if tail := driver.TailFile(console, o.Lines); tail != "" {
			fmt.Fprintln(safe, tail)
		}
		if !running {
			fmt.Fprintf(out, "==> agent-mcp journal: the VM is not running <==\n")
			return nil
		}
		fmt.Fprintf(out, "==> provisioning log (%s) <==\n", guest.ProvisionLog)
		_, perr := m.guestCommand(ctx, name, provisionLog(o.Lines, false), safe)
		fmt.Fprintf(out, "==> agent-mcp journal <==\n")
		_, err := m.guestCommand(ctx, name, journal, safe)
		return errors.Join(perr, err, safe.Flush())
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	consoleOut := &prefixWriter{w: out, prefix: "console   | ", mu: &mu}
	journalOut := &prefixWriter{w: out, prefix: "agent-mcp | ", mu: &mu}
	provisionOut := &prefixWriter{w: out, prefix: "provision | ", mu: &mu}
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs <- followFile(ctx, console, o.Lines, consoleOut)
	}()
	if running {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, err := m.guestCommand(ctx, name, journal+" -f", journalOut)
			errs <- err
		}()
		go func() {
			defer wg.Done()
			_, err := m.guestCommand(ctx, name, provisionLog(o.Lines, true), provisionOut)
			errs <- err
		}()
	}
	wg.Wait()
	consoleOut.Flush()
	journalOut.Flush()
	provisionOut.Flush()
	close(errs)
	for err := range errs {
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// provisionLog shows the last n lines of the guest's provisioning log
// (guest.ProvisionLog), following it with follow.
func provisionLog(n int, follow bool) string {
	if follow {
		return fmt.Sprintf("tail -n %d -F %s 2>/dev/null", n, guest.ProvisionLog)
	}
	return fmt.Sprintf("tail -n %d %s 2>/dev/null || echo '(none yet: the guest has not provisioned)'", n, guest.ProvisionLog)
}

// guestCommand runs a shell command in the VM, its stdout and stderr both
// to out. The SSH session copies the two streams concurrently, so out is
// locked around each write.
func (m *Manager) guestCommand(ctx context.Context, name, cmd string, out io.Writer) (int, error) {
	c, _, err := m.connect(ctx, name)
	if err != nil {
		return -1, err
	}
	defer c.Close()
	w := &lockedWriter{w: out}
	return sshx.Run(ctx, c, cmd, nil, w, w)
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// followFile writes the last n lines of path, then what is appended, until
// ctx ends. A file replaced by a new one (a restart rotates the console
// log) is followed from its start.
func followFile(ctx context.Context, path string, n int, out io.Writer) error {
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

// prefixWriter prefixes every line, escapes it for a terminal (the guest
// wrote it) and serialises writers sharing mu. A last line without a
// newline waits for Flush.
type prefixWriter struct {
	w      io.Writer
	prefix string
	mu     *sync.Mutex
	part   []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.part = append(p.part, b...)
	for {
		i := bytes.IndexByte(p.part, '\n')
		if i < 0 {
			break
		}
		line := termsafe.Line(string(p.part[:i]))
		if _, err := fmt.Fprintf(p.w, "%s%s\n", p.prefix, line); err != nil {
			return 0, err
		}
		p.part = p.part[i+1:]
	}
	return len(b), nil
}

// Flush writes a last line that has no newline yet.
func (p *prefixWriter) Flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.part) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(p.w, "%s%s\n", p.prefix, termsafe.Line(string(p.part)))
	p.part = nil
	return err
}
