package credswap

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/url"
	"slices"
	"strings"
)

// A Scrubber takes the secrets' values out of what comes back to the
// guest. A request carries a value only where Swap put it, but a server
// may send any part of a request back: an error that quotes a header, an
// echo endpoint, a page that shows what it was given. So every form a
// value may take in an answer is replaced by the same form of its
// placeholder: the value itself, URL-escaped (query and path), escaped as
// a JSON string would escape it, and its base64 (standard and URL
// alphabets) at each of the three alignments a value has inside a longer
// encoded text, as in an echoed Basic credential (there the characters
// that mix the value's bits with its neighbours' are left as they are:
// what is replaced holds the value's bits alone).
//
// It is pure: it holds the forms and nothing of what it scrubbed.
type Scrubber struct {
	forms  []form
	longer int       // the longest form's length
	first  [256]bool // the first bytes of the forms
}

// form is one way a secret's value looks in text, and what replaces it.
type form struct {
	secret   string // the secret's name, for the log
	from, to string
}

// minForm is the shortest form a Scrubber replaces: a base64 fragment of
// a short value at an awkward alignment could match text that is not it.
const minForm = 8

// Scrubber is the Scrubber of every secret of s (bound to the answer's
// host or not: no answer should hold any of them).
func (s *Set) Scrubber() *Scrubber {
	sc := &Scrubber{}
	seen := map[string]bool{}
	add := func(name, from, to string) {
		if len(from) < minForm || from == to || seen[from] {
			return
		}
		seen[from] = true
		sc.forms = append(sc.forms, form{secret: name, from: from, to: to})
	}
	for _, b := range s.secrets {
		v, p := b.Value, b.Placeholder
		add(b.Name, v, p)
		add(b.Name, url.QueryEscape(v), url.QueryEscape(p))
		add(b.Name, url.PathEscape(v), url.PathEscape(p))
		add(b.Name, jsonEscape(v), jsonEscape(p))
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			for k := range 3 {
				add(b.Name, base64At(enc, v, k), base64At(enc, p, k))
			}
		}
	}
	// Longest first: where one form starts another (a value and its
	// base64 fragment), the whole is replaced.
	slices.SortStableFunc(sc.forms, func(a, b form) int { return len(b.from) - len(a.from) })
	for _, f := range sc.forms {
		sc.longer = max(sc.longer, len(f.from))
		sc.first[f.from[0]] = true
	}
	return sc
}

// jsonEscape is v as it stands inside a JSON string (encoding/json's
// escapes, the quotes left out).
func jsonEscape(v string) string {
	b, _ := json.Marshal(v) // a string always marshals
	return string(b[1 : len(b)-1])
}

// base64At is the part of v's base64 that holds v's bits alone when v
// starts k bytes (0, 1 or 2) into a group of three: the characters that
// mix in the bytes before v or after it are cut off.
func base64At(enc *base64.Encoding, v string, k int) string {
	e := enc.EncodeToString(append(make([]byte, k), v...))
	start := []int{0, 2, 3}[k]
	n := k + len(v)
	end := n / 3 * 4
	switch n % 3 {
	case 1:
		end++
	case 2:
		end += 2
	}
	if end <= start {
		return ""
	}
	return e[start:end]
}

// String is s with every form of a value replaced, and the names of the
// secrets found, in the order found.
func (sc *Scrubber) String(s string) (string, []string) {
	var names []string
	var b strings.Builder
	for i := 0; i < len(s); {
		if f := sc.at(s[i:]); f != nil {
			b.WriteString(f.to)
			names = appendOnce(names, f.secret)
			i += len(f.from)
			continue
		}
		b.WriteByte(s[i])
		i++
	}
	if names == nil {
		return s, nil
	}
	return b.String(), names
}

// at is the form s starts with, or nil.
func (sc *Scrubber) at(s string) *form {
	if s == "" || !sc.first[s[0]] {
		return nil
	}
	for i := range sc.forms {
		if strings.HasPrefix(s, sc.forms[i].from) {
			return &sc.forms[i]
		}
	}
	return nil
}

// partial says whether s, the end of what has been read so far, may be
// the start of a form: it is held back until more is read.
func (sc *Scrubber) partial(s string) bool {
	for _, f := range sc.forms {
		if len(s) < len(f.from) && strings.HasPrefix(f.from, s) {
			return true
		}
	}
	return false
}

// Reader is r with every form of a value replaced as it streams: a form
// split across reads (or an HTTP body's chunks) is caught, since what
// could be the start of one is held back until the rest is read. found is
// called with a secret's name each time one of its forms is replaced.
func (sc *Scrubber) Reader(r io.Reader, found func(secret string)) io.Reader {
	return &scrubReader{sc: sc, r: r, found: found}
}

type scrubReader struct {
	sc    *Scrubber
	r     io.Reader
	found func(string)
	in    []byte // read, not yet scrubbed (a possible form's start)
	out   []byte // scrubbed, not yet returned
	buf   []byte // what each read of r fills
	err   error  // r's error, returned once in and out are empty
}

func (s *scrubReader) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			if len(s.in) == 0 {
				return 0, s.err
			}
			s.scrub(true)
			continue
		}
		if s.buf == nil {
			s.buf = make([]byte, max(32<<10, 2*s.sc.longer))
		}
		n, err := s.r.Read(s.buf)
		s.in = append(s.in, s.buf[:n]...)
		s.err = err
		s.scrub(err != nil)
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

// scrub moves what of in is settled to out, replacing forms; at the end
// (eof) all of it is.
func (s *scrubReader) scrub(eof bool) {
	in := string(s.in)
	i := 0
	for i < len(in) {
		if !eof && len(in)-i < s.sc.longer && s.sc.partial(in[i:]) {
			break
		}
		if f := s.sc.at(in[i:]); f != nil {
			s.out = append(s.out, f.to...)
			if s.found != nil {
				s.found(f.secret)
			}
			i += len(f.from)
			continue
		}
		j := i + 1
		for j < len(in) && !s.sc.first[in[j]] {
			j++
		}
		s.out = append(s.out, in[i:j]...)
		i = j
	}
	s.in = append(s.in[:0], in[i:]...)
}

func appendOnce(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
