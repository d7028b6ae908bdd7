package harness

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Progress while something slow runs (a boot): on a terminal one line,
// redrawn every second in place; elsewhere (CI logs) a line every
// progressEvery, so a log shows the run is alive without flooding it.
const (
	progressTick  = time.Second
	progressEvery = 15 * time.Second
	// defaultWidth is assumed when the terminal's width is unknown.
	defaultWidth = 100
)

// progress is the set of things being waited for. Guarded by reporter.mu.
type progress struct {
	live     bool // redraw one line in place (a terminal)
	width    int
	now      func() time.Time
	tasks    []*task
	lastLine time.Time // when the last plain progress line was written
	stop     chan struct{}
}

// task is one thing being waited for, e.g. a VM booting.
type task struct {
	label  string
	start  time.Time
	detail string // the latest line the command printed
}

// render is the progress line for the tasks at now, without a newline.
func (p *progress) render() string {
	now := p.now()
	parts := make([]string, 0, len(p.tasks))
	for _, t := range p.tasks {
		s := fmt.Sprintf("%s %s", t.label, fmtDuration(now.Sub(t.start).Truncate(time.Second)))
		if t.detail != "" && len(p.tasks) == 1 {
			s += ": " + t.detail
		}
		parts = append(parts, s)
	}
	line := "    … " + strings.Join(parts, " · ")
	width := p.width
	if width <= 0 {
		width = defaultWidth
	}
	return Truncate(line, width-1)
}

// due reports whether a plain (non-terminal) progress line should be
// written at now.
func (p *progress) due(now time.Time) bool {
	if len(p.tasks) == 0 {
		return false
	}
	last := p.lastLine
	if first := p.tasks[0].start; last.Before(first) {
		last = first
	}
	return now.Sub(last) >= progressEvery
}

// Truncate cuts s to at most n runes, marking the cut with "…".
func Truncate(s string, n int) string {
	if n < 1 || utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// begin starts showing a task's progress until end is called.
func (r *reporter) begin(label string) *task {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := &task{label: label, start: r.now()}
	if r.prog == nil {
		r.prog = &progress{live: r.live, width: r.width, now: r.now, stop: make(chan struct{})}
		go r.tick(r.prog)
	}
	r.prog.tasks = append(r.prog.tasks, t)
	return t
}

// update sets a task's detail from a line its command printed.
func (r *reporter) update(t *task, line string) {
	line = strings.TrimSpace(line)
	if line == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t.detail = line
}

// end stops showing a task; the line goes when the last task ends.
func (r *reporter) end(t *task) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.prog
	if p == nil {
		return
	}
	for i, x := range p.tasks {
		if x == t {
			p.tasks = append(p.tasks[:i], p.tasks[i+1:]...)
			break
		}
	}
	if len(p.tasks) == 0 {
		close(p.stop)
		if p.live {
			r.w.Write([]byte(clearLine))
		}
		r.prog = nil
	}
}

// tick redraws (terminal) or writes (elsewhere) the progress line until the
// last task ends.
func (r *reporter) tick(p *progress) {
	tk := time.NewTicker(progressTick)
	defer tk.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tk.C:
		}
		r.mu.Lock()
		if r.prog == p {
			switch {
			case p.live:
				r.w.Write([]byte(clearLine + p.render()))
			case p.due(r.now()):
				p.lastLine = r.now()
				r.w.Write([]byte(p.render() + "\n"))
			}
		}
		r.mu.Unlock()
	}
}
