package gitpush

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// readAll reads the pkt-lines of s: each line's data, "FLUSH" for a
// flush-pkt, until EOF or the first error.
func readAll(s string) ([]string, error) {
	pr := &pktReader{r: strings.NewReader(s)}
	var out []string
	for {
		line, err := pr.next()
		switch {
		case errors.Is(err, errFlush):
			out = append(out, "FLUSH")
		case errors.Is(err, io.EOF):
			return out, nil
		case err != nil:
			return out, err
		default:
			out = append(out, string(line))
		}
	}
}

func TestPktReaderGood(t *testing.T) {
	long := strings.Repeat("x", maxPktLen-4)
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"empty stream", "", nil},
		{"flush only", "0000", []string{"FLUSH"}},
		{"two lines and a flush", "0009hello0006a\n0000", []string{"hello", "a\n", "FLUSH"}},
		{"empty line", "0004", []string{""}},
		{"uppercase hex", "000Ahello!", []string{"hello!"}},
		{"the longest line", "fff0" + long, []string{long}},
		{"binary data", "0007\x00\xff\n", []string{"\x00\xff\n"}},
	} {
		got, err := readAll(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestPktReaderMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"length 0001 (v2 delimiter)", "0001", `pkt-line length "0001" is not valid`},
		{"length 0002 (v2 response end)", "0002", `pkt-line length "0002" is not valid`},
		{"length 0003", "0003", `pkt-line length "0003" is not valid`},
		{"over the maximum", "fff1" + strings.Repeat("x", 0xfff1), `pkt-line length "fff1" is over git's maximum`},
		{"ffff", "ffff", `pkt-line length "ffff" is over git's maximum`},
		{"not hex", "00g9hello", `pkt-line length "00g9" is not 4 hex digits`},
		{"a sign", "+009hello", `is not 4 hex digits`},
		{"a space", " 009hello", `is not 4 hex digits`},
		{"HTTP instead", "GET / HTTP/1.1", `is not 4 hex digits`},
		{"truncated length", "00", "the stream ends after 2 of its 4 bytes"},
		{"truncated length after a line", "0005a00", "the stream ends after 2 of its 4 bytes"},
		{"truncated data", "0009hel", "reading a pkt-line of 9 bytes: the stream ends before its end"},
		{"no data at all", "0009", "reading a pkt-line of 9 bytes: the stream ends before its end"},
	} {
		_, err := readAll(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// A read error of the underlying stream is passed on, wrapped.
func TestPktReaderReadError(t *testing.T) {
	boom := errors.New("connection reset")
	pr := &pktReader{r: io.MultiReader(strings.NewReader("0009he"), errReader{boom})}
	if _, err := pr.next(); !errors.Is(err, boom) {
		t.Errorf("got %v, want it to wrap %v", err, boom)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// The reader never reads past the pkt-line it returns.
func TestPktReaderNoReadAhead(t *testing.T) {
	r := strings.NewReader("0009hello0000PACK")
	pr := &pktReader{r: r}
	if _, err := pr.next(); err != nil {
		t.Fatal(err)
	}
	if _, err := pr.next(); !errors.Is(err, errFlush) {
		t.Fatalf("got %v, want the flush-pkt", err)
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "PACK" {
		t.Errorf("left %q unread, want %q", rest, "PACK")
	}
}
