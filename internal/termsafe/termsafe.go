// Package termsafe makes untrusted text safe to print on a terminal.
//
// File names, commit subjects and git settings from a workspace, and the
// guest's console and journal, are written by the agent. Printed as they
// are, a newline could forge a line of agent-vm's own output ("it is safe:
// agent-vm destroy ... --force"), and ESC, CSI or OSC sequences could move
// the cursor, retitle the window or rewrite what is shown. String turns
// every such character into a visible escape (\n, \x1b, \u202e) instead.
package termsafe

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// String returns s with every character a terminal could act on, or that
// hides or reorders text, written as a visible escape: C0 controls
// (including newline and tab) as \n, \r, \t or \xNN; DEL as \x7f; C1
// controls, Unicode format characters (bidi overrides, zero-width
// characters) and line or paragraph separators as \uNNNN; each byte of
// invalid UTF-8 as \xNN. Backslashes are left as they are, so String is
// idempotent: escaping twice is escaping once.
func String(s string) string {
	if clean(s, "") {
		return s
	}
	var b strings.Builder
	write(&b, s, "")
	return b.String()
}

// Line is String for a line of the guest's console or journal: CSI
// sequences (colours and cursor control, which systemd writes) are dropped,
// tabs kept, and a trailing carriage return removed; the rest is escaped as
// String does (OSC and any other escape included).
func Line(s string) string {
	s = strings.TrimSuffix(s, "\r")
	if strings.Contains(s, "\x1b[") {
		s = csi.ReplaceAllString(s, "")
	}
	if clean(s, "\t") {
		return s
	}
	var b strings.Builder
	write(&b, s, "\t")
	return b.String()
}

// csi matches a Control Sequence Introducer sequence (colours, erase line,
// cursor moves): the only escape sequences Line removes rather than shows.
// Removed, they do nothing; what is left of a longer sequence is escaped.
var csi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// unsafe reports whether r must be escaped.
func unsafe(r rune) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) ||
		unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// clean reports whether s needs no escaping, keep naming runes allowed as
// they are.
func clean(s, keep string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || (unsafe(r) && !strings.ContainsRune(keep, r)) {
			return false
		}
		i += n
	}
	return true
}

func write(b *strings.Builder, s, keep string) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(b, `\x%02x`, s[i])
		case !unsafe(r) || strings.ContainsRune(keep, r):
			b.WriteString(s[i : i+n])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x80:
			fmt.Fprintf(b, `\x%02x`, r)
		default:
			fmt.Fprintf(b, `\u%04x`, r)
		}
		i += n
	}
}

// Indent indents the guest's console lines, escaped, for an error message.
func Indent(s string) string {
	if s == "" {
		return "  (empty)"
	}
	var b strings.Builder
	for i, l := range strings.Split(s, "\n") {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString("  " + Line(l))
	}
	return b.String()
}
