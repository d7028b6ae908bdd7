package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// progress renders a vm.Reporter on stderr: one updating line on a
// terminal, a line every 15 s (and on every phase change) otherwise.
type progress struct {
	w        io.Writer
	tty      bool
	mu       sync.Mutex
	phase    string
	lastLine time.Time
	spin     int
	dirty    bool
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty = true
	}
	return p
}

func (p *progress) reporter() vm.Reporter {
	return func(phase string, elapsed time.Duration, detail string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		detail = termsafe.String(detail) // the guest's console line, or its /health answer
		secs := elapsed.Truncate(time.Second)
		if p.tty {
			frames := []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}
			p.spin++
			line := fmt.Sprintf("%s %s %s", frames[p.spin%len(frames)], phase, secs)
			if detail != "" {
				line += " · " + detail
			}
			if w, _, err := term.GetSize(int(p.w.(*os.File).Fd())); err == nil && len([]rune(line)) > w-1 && w > 10 {
				line = string([]rune(line)[:w-2]) + "…"
			}
			fmt.Fprintf(p.w, "\r\033[K%s", line)
			p.dirty = true
			return
		}
		if phase != p.phase || time.Since(p.lastLine) >= 15*time.Second {
			line := fmt.Sprintf("%s (%s)", phase, secs)
			if detail != "" {
				line += ": " + strings.TrimSpace(detail)
			}
			fmt.Fprintln(p.w, line)
			p.phase, p.lastLine = phase, time.Now()
		}
	}
}

// done clears the updating line.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.dirty {
		fmt.Fprint(p.w, "\r\033[K")
		p.dirty = false
	}
}
