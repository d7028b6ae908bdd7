package mcpconfig

import (
	"bytes"
	"strings"
)

// Ref is one ${NAME} or ${NAME:-default} in a config string.
type Ref struct {
	Name       string
	Default    string
	HasDefault bool
	Text       string // as written, "${...}"
}

// Replace rewrites every ${NAME} and ${NAME:-default} in s with what f
// returns for it. Text that only looks like one (an invalid name, no closing
// brace) is left as written, and so is a bare $NAME: Claude Code expands
// neither.
func Replace(s string, f func(Ref) string) string {
	var b strings.Builder
	for {
		start := strings.Index(s, "${")
		if start < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := strings.IndexByte(s[start:], '}')
		if end < 0 {
			b.WriteString(s)
			return b.String()
		}
		end += start
		b.WriteString(s[:start])
		text := s[start : end+1]
		name, def, hasDef := strings.Cut(s[start+2:end], ":-")
		if ValidVarName(name) {
			b.WriteString(f(Ref{Name: name, Default: def, HasDefault: hasDef, Text: text}))
		} else {
			b.WriteString(text)
		}
		s = s[end+1:]
	}
}

// Expand replaces ${NAME} and ${NAME:-default} from lookup, as Claude Code
// does; it returns the names that were unset and had no default (their text
// is left as written, as Claude Code leaves it).
func Expand(s string, lookup func(string) (string, bool)) (string, []string) {
	var missing []string
	out := Replace(s, func(r Ref) string {
		if v, ok := lookup(r.Name); ok {
			return v
		}
		if r.HasDefault {
			return r.Default
		}
		missing = append(missing, r.Name)
		return r.Text
	})
	return out, missing
}

// HasRef reports whether s holds a ${NAME} reference.
func HasRef(s string) bool {
	found := false
	Replace(s, func(r Ref) string { found = true; return r.Text })
	return found
}

// ValidVarName reports whether s is an environment variable name a ${...}
// reference may use.
func ValidVarName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// LineCol turns a byte offset in data (a JSON syntax error's) into a line
// and column, both counted from 1.
func LineCol(data []byte, offset int64) (line, col int) {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	if offset < 0 {
		offset = 0
	}
	prefix := data[:offset]
	line = bytes.Count(prefix, []byte("\n")) + 1
	col = int(offset) - (bytes.LastIndexByte(prefix, '\n') + 1)
	if col < 1 {
		col = 1
	}
	return line, col
}
