package credswap

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"
)

// Every form of a value a server may send back is replaced, in a string
// and in a stream read a byte at a time (each form split across reads),
// and what is not a value is left as it was.
func TestScrubber(t *testing.T) {
	set, err := New([]Secret{
		{Name: "GITHUB_TOKEN", Placeholder: ghPH, Value: ghVal, Hosts: []string{"api.github.com"}},
		{Name: "ODD", Placeholder: "agentvm-ph-odd-0123456789", Value: `v"al/ue+&=<x> ü`, Hosts: []string{"odd.example"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sc := set.Scrubber()
	odd := `v"al/ue+&=<x> ü`
	js, _ := json.Marshal(map[string]string{"echo": odd})
	cases := map[string]string{
		"plain":      "X-Echo: " + ghVal + "\r\n",
		"twice":      ghVal + ghVal,
		"json":       string(js),
		"query":      "https://x/?k=" + url.QueryEscape(odd),
		"path":       "https://x/" + url.PathEscape(odd),
		"basic echo": "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+ghVal)),
		"basic user": base64.StdEncoding.EncodeToString([]byte(ghVal + ":x")),
		"one off":    base64.StdEncoding.EncodeToString([]byte("ab" + ghVal + "c")),
		"url base64": base64.URLEncoding.EncodeToString([]byte("?" + odd)),
		"nothing":    "a body with no secret in it, " + ghPH,
		"almost":     ghVal[:len(ghVal)-1] + "!",
	}
	for name, in := range cases {
		got, names := sc.String(in)
		var streamed bytes.Buffer
		var found []string
		if _, err := io.Copy(&streamed, sc.Reader(iotest.OneByteReader(strings.NewReader(in)), func(s string) { found = appendOnce(found, s) })); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if streamed.String() != got {
			t.Errorf("%s: streamed %q, the string gave %q", name, streamed.String(), got)
		}
		if strings.Join(found, ",") != strings.Join(names, ",") {
			t.Errorf("%s: the stream found %v, the string %v", name, found, names)
		}
		for _, v := range []string{ghVal, odd} {
			for _, form := range forms(v) {
				if strings.Contains(got, form) {
					t.Errorf("%s: %q still holds %q", name, got, form)
				}
			}
		}
		for _, b := range decodings(got) {
			for _, v := range []string{ghVal, odd} {
				if strings.Contains(b, v) {
					t.Errorf("%s: %q decodes to %q, which holds a value", name, got, b)
				}
			}
		}
		switch name {
		case "nothing", "almost":
			if got != in || names != nil {
				t.Errorf("%s: %q became %q (%v)", name, in, got, names)
			}
		default:
			if len(names) != 1 {
				t.Errorf("%s: %q found %v, want one secret", name, in, names)
			}
		}
	}
	if got, _ := sc.String("X-Echo: " + ghVal); got != "X-Echo: "+ghPH {
		t.Errorf("the value is replaced by %q, want its placeholder", got)
	}
	if got, _ := sc.String(base64.StdEncoding.EncodeToString([]byte("x-access-token:" + ghVal))); !strings.Contains(b64decode(got), ghPH[2:len(ghPH)-2]) {
		t.Errorf("an echoed Basic credential decodes to %q, want the placeholder in it", b64decode(got))
	}
}

// forms are the forms of v that must not come back.
func forms(v string) []string {
	out := []string{v, url.QueryEscape(v), url.PathEscape(v), jsonEscape(v)}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for k := range 3 {
			out = append(out, base64At(enc, v, k))
		}
	}
	return out
}

// decodings are s decoded every way a client might: base64 at each
// offset (the text's longest run of base64), URL and JSON.
func decodings(s string) []string {
	out := []string{s}
	if u, err := url.QueryUnescape(s); err == nil {
		out = append(out, u)
	}
	var m map[string]string
	if json.Unmarshal([]byte(s), &m) == nil {
		for _, v := range m {
			out = append(out, v)
		}
	}
	for i := range 4 {
		if i < len(s) {
			out = append(out, b64decode(s[i:]))
		}
	}
	return out
}

func b64decode(s string) string {
	var out []byte
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		b, _ := enc.DecodeString(strings.TrimRight(s, "=")[:len(strings.TrimRight(s, "="))/4*4])
		out = append(out, b...)
	}
	return string(out)
}

// FuzzScrubber: whatever the text and however it is split into reads, the
// stream gives what String gives, and neither holds the value. A value
// that overlaps its placeholder's edge (a start of one the end of the
// other) is left out: there the text after a replaced value could make
// the value again with the placeholder's end, but only with the rest of
// the value after it, which only a party holding the value can send
// (real placeholders end in 32 random hex digits).
func FuzzScrubber(f *testing.F) {
	f.Add("ghp_REALgithubTOKENvalue", "x ghp_REALgithubTOKENvalue y", uint8(3))
	f.Add("secret-value", base64.StdEncoding.EncodeToString([]byte("u:secret-value")), uint8(1))
	f.Fuzz(func(t *testing.T, value, text string, step uint8) {
		const ph = "agentvm-ph-fuzz-00000000"
		set, err := New([]Secret{{Name: "S", Placeholder: ph, Value: value, Hosts: []string{"a.example"}}})
		if err != nil || len(value) < minForm || strings.Contains(ph, value) {
			return
		}
		for i := 1; i < len(ph) && i < len(value); i++ {
			if strings.HasSuffix(ph, value[:i]) || strings.HasPrefix(ph, value[len(value)-i:]) {
				return
			}
		}
		sc := set.Scrubber()
		got, _ := sc.String(text)
		var streamed bytes.Buffer
		r := sc.Reader(&stepReader{s: text, step: int(step%16) + 1}, nil)
		if _, err := io.Copy(&streamed, r); err != nil {
			t.Fatal(err)
		}
		if streamed.String() != got {
			t.Fatalf("streamed %q, the string gave %q", streamed.String(), got)
		}
		if strings.Contains(got, value) {
			t.Fatalf("%q scrubbed is %q, which holds the value %q", text, got, value)
		}
	})
}

// stepReader reads s step bytes at a time.
type stepReader struct {
	s    string
	step int
}

func (r *stepReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.step)], r.s)
	r.s = r.s[n:]
	return n, nil
}
