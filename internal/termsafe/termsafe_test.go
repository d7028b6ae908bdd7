package termsafe

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	cases := []struct{ in, want string }{
		{"plain name.txt", "plain name.txt"},
		{"ünïcødé 分支 ветка", "ünïcødé 分支 ветка"},
		{`back\slash`, `back\slash`},
		{"a\nit is safe: agent-vm destroy x --force", `a\nit is safe: agent-vm destroy x --force`},
		{"cr\rover", `cr\rover`},
		{"tab\there", `tab\there`},
		{"\x1b[2J\x1b]0;title\x07", `\x1b[2J\x1b]0;title\x07`},
		{"nul\x00del\x7f", `nul\x00del\x7f`},
		{"c1 csi \u009b31m", `c1 csi \u009b31m`},
		{"bidi \u202eexe.txt", `bidi \u202eexe.txt`},
		{"zero\u200bwidth", `zero\u200bwidth`},
		{"line\u2028sep", `line\u2028sep`},
		{"bad \xff\xfe utf8", `bad \xff\xfe utf8`},
		{"cut \xe2\x80", `cut \xe2\x80`},
	}
	for _, c := range cases {
		if got := String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestLine(t *testing.T) {
	cases := []struct{ in, want string }{
		{"[  \x1b[0;32mOK\x1b[0m  ] Started foo.\r", "[  OK  ] Started foo."},
		{"col\tumns", "col\tumns"},
		{"\x1b]0;pwned\x07title", `\x1b]0;pwned\x07title`},
		{"\x1b[1A\x1b[2Kup\x1b[?25l", "up"},
		{"\x1b[\x1b[31mx", `\x1b[x`},
		{"mid\rline", `mid\rline`},
		{"a\nb", `a\nb`},
	}
	for _, c := range cases {
		if got := Line(c.in); got != c.want {
			t.Errorf("Line(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func FuzzString(f *testing.F) {
	for _, s := range []string{"x", "a\nb", "\x1b[31m", "\u202e", "\xff", `\x1b`, "\t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, got := range map[string]string{"String": String(s), "Line": Line(s)} {
			if !utf8.ValidString(got) {
				t.Fatalf("%s(%q) = %q: invalid UTF-8", name, s, got)
			}
			for _, r := range got {
				if unsafe(r) && !(name == "Line" && r == '\t') {
					t.Fatalf("%s(%q) = %q keeps %U", name, s, got, r)
				}
			}
		}
		if got := String(s); String(got) != got {
			t.Fatalf("String is not idempotent on %q: %q, then %q", s, got, String(got))
		}
		if !strings.ContainsAny(s, "\x1b\t\r") && Line(s) != String(s) {
			t.Fatalf("Line(%q) = %q, String gives %q", s, Line(s), String(s))
		}
	})
}
