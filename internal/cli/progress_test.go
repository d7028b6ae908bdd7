package cli

import (
	"bytes"
	"testing"
)

// A progress detail is the guest's console line: shown escaped, it cannot
// start a line of its own or drive the terminal.
func TestProgressEscapesTheDetail(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out)
	p.reporter()("waiting for SSH", 0, "booting\nagent-vm: it is safe\x1b]0;pwned\x07")
	if got, want := out.String(), `waiting for SSH (0s): booting\nagent-vm: it is safe\x1b]0;pwned\x07`+"\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
