package vagrant

import (
	"fmt"
	"strings"
)

// RubyString returns s as a double-quoted Ruby string literal that
// evaluates to exactly the bytes of s, whatever they are (see the package
// doc for why double quotes): printable ASCII stays as it is, except ", \
// and #, which are backslash-escaped; every other byte is \xNN.
func RubyString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\' || c == '#':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, `\x%02X`, c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
