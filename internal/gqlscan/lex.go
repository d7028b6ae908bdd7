package gqlscan

import (
	"fmt"
	"strings"
)

// kind is a token's kind.
type kind int

const (
	eof kind = iota
	punct
	name
	number
	str
)

// token is one lexical token: its kind, its text as written (a
// string's quotes included) and its offset.
type token struct {
	kind kind
	text string
	pos  int
}

// lexer reads tokens from src. Outside strings it takes printable ASCII,
// tab, CR and LF only (comments included): a character another reader
// might take for a line end, or for nothing, cannot hide a definition in
// what this one skips as a comment.
type lexer struct {
	src string
	pos int
}

func (l *lexer) errorf(format string, args ...any) error {
	return fmt.Errorf("at offset %d: %s", l.pos, fmt.Sprintf(format, args...))
}

// next skips what GraphQL ignores (white space, line ends, commas and
// comments) and reads the token after it.
func (l *lexer) next() (token, error) {
	if err := l.skipIgnored(); err != nil {
		return token{}, err
	}
	start := l.pos
	if l.pos == len(l.src) {
		return token{kind: eof, pos: start}, nil
	}
	c := l.src[l.pos]
	switch {
	case strings.HasPrefix(l.src[l.pos:], "..."):
		l.pos += 3
		return token{kind: punct, text: "...", pos: start}, nil
	case strings.IndexByte("!$&():=@[]{|}", c) >= 0:
		l.pos++
		return token{kind: punct, text: string(c), pos: start}, nil
	case isNameStart(c):
		for l.pos < len(l.src) && isNameContinue(l.src[l.pos]) {
			l.pos++
		}
		return token{kind: name, text: l.src[start:l.pos], pos: start}, nil
	case c == '-' || isDigit(c):
		if err := l.number(); err != nil {
			return token{}, err
		}
		return token{kind: number, text: l.src[start:l.pos], pos: start}, nil
	case c == '"':
		var err error
		if strings.HasPrefix(l.src[l.pos:], `"""`) {
			err = l.blockString()
		} else {
			err = l.string()
		}
		if err != nil {
			return token{}, err
		}
		return token{kind: str, text: l.src[start:l.pos], pos: start}, nil
	}
	return token{}, l.errorf("unexpected character %q", c)
}

func (l *lexer) skipIgnored() error {
	for l.pos < len(l.src) {
		switch c := l.src[l.pos]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',':
			l.pos++
		case c == '#':
			for l.pos < len(l.src) && l.src[l.pos] != '\n' && l.src[l.pos] != '\r' {
				if c := l.src[l.pos]; c != '\t' && (c < 0x20 || c > 0x7e) {
					return l.errorf("character %q in a comment (only printable ASCII is read outside strings)", c)
				}
				l.pos++
			}
		case c < 0x20 || c > 0x7e:
			return l.errorf("character %q outside a string (only printable ASCII is read there)", c)
		default:
			return nil
		}
	}
	return nil
}

// number reads an IntValue or a FloatValue: -?(0|[1-9][0-9]*), then an
// optional fraction and exponent, not followed by a name or a dot.
func (l *lexer) number() error {
	if l.peekByte() == '-' {
		l.pos++
	}
	switch c := l.peekByte(); {
	case c == '0':
		l.pos++
		if isDigit(l.peekByte()) {
			return l.errorf("a number with a leading zero")
		}
	case isDigit(c):
		l.digits()
	default:
		return l.errorf("a minus sign without digits")
	}
	if l.peekByte() == '.' {
		l.pos++
		if !isDigit(l.peekByte()) {
			return l.errorf("a number's fraction without digits")
		}
		l.digits()
	}
	if c := l.peekByte(); c == 'e' || c == 'E' {
		l.pos++
		if c := l.peekByte(); c == '+' || c == '-' {
			l.pos++
		}
		if !isDigit(l.peekByte()) {
			return l.errorf("a number's exponent without digits")
		}
		l.digits()
	}
	if c := l.peekByte(); c == '.' || isNameStart(c) {
		return l.errorf("a number followed by %q", c)
	}
	return nil
}

func (l *lexer) digits() {
	for isDigit(l.peekByte()) {
		l.pos++
	}
}

// string reads a "..." string: no line ends in it, escapes as the
// specification lists them (\uXXXX with four hex digits).
func (l *lexer) string() error {
	l.pos++ // "
	for l.pos < len(l.src) {
		c := l.src[l.pos]
		switch {
		case c == '"':
			l.pos++
			return nil
		case c == '\\':
			l.pos++
			e := l.peekByte()
			switch {
			case strings.IndexByte(`"\/bfnrt`, e) >= 0:
				l.pos++
			case e == 'u' && l.pos+5 <= len(l.src) && allHex(l.src[l.pos+1:l.pos+5]):
				l.pos += 5
			default:
				return l.errorf("an escape the specification does not have in a string")
			}
		case c == '\n' || c == '\r':
			return l.errorf("a line end in a string")
		case c < 0x20 && c != '\t' || c == 0x7f:
			return l.errorf("control character %q in a string", c)
		default:
			l.pos++
		}
	}
	return l.errorf("a string without its closing quote")
}

// blockString reads a """...""" string. Its one escape, \""" (a triple
// quote in the text), is refused: readers disagree on what precedes it
// (is \\""" an escaped backslash and the end?), and no client needs it.
func (l *lexer) blockString() error {
	l.pos += 3
	for l.pos < len(l.src) {
		rest := l.src[l.pos:]
		switch c := rest[0]; {
		case strings.HasPrefix(rest, `"""`):
			l.pos += 3
			return nil
		case strings.HasPrefix(rest, `\"""`):
			return l.errorf(`an escaped triple quote (\""") in a block string`)
		case c < 0x20 && c != '\t' && c != '\n' && c != '\r' || c == 0x7f:
			return l.errorf("control character %q in a block string", c)
		default:
			l.pos++
		}
	}
	return l.errorf("a block string without its closing quotes")
}

func (l *lexer) peekByte() byte {
	if l.pos < len(l.src) {
		return l.src[l.pos]
	}
	return 0
}

func isDigit(c byte) bool        { return c >= '0' && c <= '9' }
func isNameStart(c byte) bool    { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isNameContinue(c byte) bool { return isNameStart(c) || isDigit(c) }

func allHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isDigit(c) && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
			return false
		}
	}
	return true
}
