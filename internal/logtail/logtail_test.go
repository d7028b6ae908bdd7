package logtail

import (
	"bytes"
	"sync"
	"testing"
)

// logs -f: each line from the guest is prefixed and escaped, however the
// writes split it.
func TestPrefixWriterEscapesLines(t *testing.T) {
	var out bytes.Buffer
	w := &PrefixWriter{W: &out, Prefix: "console   | ", Mu: &sync.Mutex{}}
	for _, chunk := range []string{"ok\r\nev", "il \x1b]0;t\x07 \xe2\x80", "\xae x\n\x1b[1;31mred\x1b[0m\n", "partial"} {
		w.Write([]byte(chunk))
	}
	w.Flush()
	want := "console   | ok\nconsole   | evil \\x1b]0;t\\x07 \\u202e x\nconsole   | red\nconsole   | partial\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}
