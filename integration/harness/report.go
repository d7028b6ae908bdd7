package harness

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Marks in front of a step's line.
const (
	MarkPass = "✓"
	MarkFail = "✗"
	MarkSkip = "–"
)

// ANSI styles, used only when colour is on.
const (
	styleReset  = "\x1b[0m"
	styleBold   = "\x1b[1m"
	styleDim    = "\x1b[2m"
	styleRed    = "\x1b[31m"
	styleGreen  = "\x1b[32m"
	styleYellow = "\x1b[33m"
	clearLine   = "\r\x1b[K"
)

// stepWidth is the column where a step's elapsed time starts.
const stepWidth = 60

// tailLines bounds the lines of command output and serial log printed on a
// failure.
const tailLines = 40

// reporter writes what a user reads. It is safe for concurrent use (two VMs
// boot at once in one scenario); every line is written whole, and a live
// progress line, when shown, is cleared first and redrawn after.
type reporter struct {
	mu      sync.Mutex
	w       io.Writer
	color   bool // ANSI colours
	live    bool // a terminal: the progress line is redrawn in place
	width   int  // the terminal's width, 0 if unknown
	verbose bool
	now     func() time.Time
	prog    *progress // nil when nothing is being waited for
	// open is the call whose "$ command" line was the last thing printed
	// (verbose): its outcome follows without repeating the command.
	open *Result
}

// style wraps s in an ANSI style when colour is on.
func (r *reporter) style(code, s string) string {
	if !r.color || s == "" {
		return s
	}
	return code + s + styleReset
}

// print writes text (one or more whole lines) around the progress line.
func (r *reporter) print(text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.printLocked(text)
}

func (r *reporter) printLocked(text string) {
	r.open = nil
	live := r.prog != nil && r.prog.live
	if live {
		io.WriteString(r.w, clearLine)
	}
	io.WriteString(r.w, text)
	if live {
		io.WriteString(r.w, r.prog.render())
	}
}

func (r *reporter) printf(format string, args ...any) { r.print(fmt.Sprintf(format, args...)) }

// headerLine is one "  key  value" line of the header.
func (r *reporter) headerLine(key, value string) {
	r.printf("  %-10s %s\n", key, value)
}

// title starts the output, or a scenario.
func (r *reporter) title(s string) { r.printf("%s\n", r.style(styleBold, s)) }

// scenario announces a scenario.
func (r *reporter) scenario(name, summary string) {
	r.printf("\n%s %s\n", r.style(styleBold, name), r.style(styleDim, "— "+summary))
}

// step prints a step's line: its mark, its name, and in a column its
// elapsed time (or "not run"), then a note.
func (r *reporter) step(mark, name string, elapsed time.Duration, note string) {
	style := map[string]string{MarkPass: styleGreen, MarkFail: styleRed, MarkSkip: styleYellow}[mark]
	col := fmtDuration(elapsed)
	if mark == MarkSkip {
		col = "not run"
	}
	pad := max(stepWidth-utf8.RuneCountInString(name), 1)
	line := "  " + r.style(style, mark) + " " + name + strings.Repeat(" ", pad) + r.style(styleDim, col)
	if note != "" {
		line += "  " + r.style(styleDim, note)
	}
	r.print(line + "\n")
}

// skip says a whole scenario is skipped, and why.
func (r *reporter) skip(reason string) {
	r.print("  " + r.style(styleYellow, MarkSkip) + " skipped: " + reason + "\n")
}

// detail prints indented lines under a step (a failure's explanation, the
// command that failed, a serial log tail).
func (r *reporter) detail(text string) {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		b.WriteString("      " + l + "\n")
	}
	r.print(b.String())
}

// command shows a finished agent-vm call in full: how to run it again,
// how it ended, and the tails of its output. Used for failures, and for
// every call in verbose mode.
func (r *reporter) command(res *Result, full bool) {
	var b strings.Builder
	r.mu.Lock()
	open := r.open == res
	r.mu.Unlock()
	switch {
	case full:
		fmt.Fprintf(&b, "$ %s\n", res.Reproduce())
	case !open:
		fmt.Fprintf(&b, "$ %s\n", res.Short())
	}
	fmt.Fprintf(&b, "%s after %s\n", res.Outcome(), fmtDuration(res.Elapsed))
	writeTail(&b, "stdout", res.Stdout)
	writeTail(&b, "stderr", res.Stderr)
	r.detail(b.String())
}

// started shows, in verbose mode, a command as it starts.
func (r *reporter) started(res *Result) {
	if !r.verbose {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.printLocked("      " + r.style(styleDim, "$ "+res.Short()) + "\n")
	r.open = res
}

// secretPatterns match the MCP token where agent-vm prints it (status
// --json, status, an Authorization header), so output shown on a failure
// or in verbose mode never carries it into a log.
func secretPatterns() []*regexp.Regexp {
	return []*regexp.Regexp{
		regexp.MustCompile(`("token"\s*:\s*")[^"]*(")`),
		regexp.MustCompile(`(?m)^(\s*token:\s*)\S+`),
		regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+`),
	}
}

// redactSecrets replaces the secrets in s with <redacted>.
func redactSecrets(s string) string {
	for _, re := range secretPatterns() {
		s = re.ReplaceAllString(s, "${1}<redacted>${2}")
	}
	return s
}

// writeTail writes the last tailLines lines of out under a label, or
// nothing when out is empty. Secrets are redacted.
func writeTail(b *strings.Builder, label, out string) {
	out = strings.TrimRight(redactSecrets(out), "\n")
	if out == "" {
		return
	}
	lines := strings.Split(out, "\n")
	if n := len(lines) - tailLines; n > 0 {
		fmt.Fprintf(b, "%s (last %d of %d lines):\n", label, tailLines, len(lines))
		lines = lines[n:]
	} else {
		fmt.Fprintf(b, "%s:\n", label)
	}
	for _, l := range lines {
		if strings.ContainsFunc(l, func(r rune) bool { return r != '\t' && !unicode.IsPrint(r) }) {
			// agent-vm's output may carry what a workspace or guest wrote:
			// never pass control characters on to the terminal.
			l = strings.Trim(strconv.Quote(l), `"`)
		}
		fmt.Fprintf(b, "  | %s\n", l)
	}
}

// summary prints the closing line, exactly "N passed, N failed, N skipped".
func (r *reporter) summary(passed, failed, skipped int) {
	line := fmt.Sprintf("%d passed, %d failed, %d skipped", passed, failed, skipped)
	switch {
	case failed > 0:
		line = r.style(styleRed+styleBold, line)
	case passed > 0:
		line = r.style(styleGreen+styleBold, line)
	}
	r.print(line + "\n")
}

// fmtDuration prints a duration the way a person reads it: 0.12s, 4.3s,
// 1m12s.
func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	default:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
}
