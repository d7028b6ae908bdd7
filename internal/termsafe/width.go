package termsafe

import (
	"strings"
	"unicode"
)

// The width of text on a terminal, in columns, for tables and screens that
// line text up: text/tabwriter counts runes, which misaligns wide
// characters.

// Truncate shortens s to at most n terminal columns, ending it with
// "…" when it cuts.
func Truncate(s string, n int) string {
	if Width(s) <= n {
		return s
	}
	var b strings.Builder
	width := 0
	for _, r := range s {
		rw := runeWidth(r)
		if width+rw > n-1 {
			break
		}
		b.WriteRune(r)
		width += rw
	}
	return b.String() + "…"
}

// TruncateStart shortens s to at most n terminal columns, starting it
// with "…" when it cuts (for paths, whose end says the most).
func TruncateStart(s string, n int) string {
	if Width(s) <= n {
		return s
	}
	rs := []rune(s)
	width, i := 0, len(rs)
	for i > 0 && width+runeWidth(rs[i-1]) <= n-1 {
		i--
		width += runeWidth(rs[i])
	}
	return "…" + string(rs[i:])
}

// Width is how many terminal columns s takes.
func Width(s string) int {
	n := 0
	for _, r := range s {
		n += runeWidth(r)
	}
	return n
}

// wideRanges are the East Asian Wide and Fullwidth blocks (UAX #11) and the
// emoji blocks terminals draw two columns wide.
var wideRanges = [][2]rune{
	{0x1100, 0x115f}, {0x2e80, 0x303e}, {0x3041, 0x33ff}, {0x3400, 0x4dbf}, {0x4e00, 0x9fff},
	{0xa000, 0xa4cf}, {0xac00, 0xd7a3}, {0xf900, 0xfaff}, {0xfe30, 0xfe4f}, {0xff00, 0xff60},
	{0xffe0, 0xffe6}, {0x1f300, 0x1f64f}, {0x1f900, 0x1f9ff}, {0x20000, 0x3fffd},
}

// runeWidth is the terminal columns of r: 0 for combining marks and format
// characters, 2 for wide ones, else 1.
func runeWidth(r rune) int {
	if unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf) {
		return 0
	}
	for _, wr := range wideRanges {
		if r >= wr[0] && r <= wr[1] {
			return 2
		}
	}
	return 1
}
