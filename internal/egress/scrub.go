package egress

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/agent-vm/agent-vm/internal/credswap"
)

// scrubAnswer readies resp, an answer in an intercepted tunnel, for the
// guest: the secrets' values (every form credswap.Scrubber knows) are
// taken out of its headers and, as it streams, out of its body and
// trailers; found gets the name of each secret taken out. A body the
// server compressed with gzip although the request asked for identity
// (askIdentity) is decoded first; one in an encoding the proxy cannot
// read is refused (the error says so) rather than passed on unread. A
// body that may change length goes on chunked.
func scrubAnswer(sc *credswap.Scrubber, resp *http.Response, found func(string)) error {
	scrubHeader(sc, resp.Header, found)
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	body := io.ReadCloser(resp.Body)
	switch ce := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); ce {
	case "", "identity":
	case "gzip", "x-gzip":
		gz, err := gzip.NewReader(body)
		if err != nil {
			return fmt.Errorf("its gzip body cannot be read (%v), so it cannot be checked for the secrets' values", err)
		}
		body = readCloser{gz, body}
		resp.Header.Del("Content-Encoding")
	default:
		return fmt.Errorf("it came with Content-Encoding %s, which the proxy cannot read to check it for the secrets' values", ce)
	}
	raw := resp.Body
	resp.Body = readCloser{&atEOF{r: sc.Reader(body, found), done: func() {
		// The trailers are read with the end of the raw body (a gzip
		// stream may end before it), and written after the body.
		_, _ = io.Copy(io.Discard, raw)
		scrubHeader(sc, resp.Trailer, found)
	}}, body}
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.TransferEncoding = []string{"chunked"}
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	return nil
}

// scrubHeader takes the secrets' values out of h's values, in place.
func scrubHeader(sc *credswap.Scrubber, h http.Header, found func(string)) {
	for k, vs := range h {
		for i, v := range vs {
			s, names := sc.String(v)
			vs[i] = s
			for _, n := range names {
				found(n)
			}
		}
		h[k] = vs
	}
}

// askIdentity asks the host for an answer that is not compressed, so that
// the proxy can read it for the secrets' values without decoding it.
func askIdentity(req *http.Request) {
	req.Header.Set("Accept-Encoding", "identity")
}

// atEOF is r that runs done once, when r ends.
type atEOF struct {
	r    io.Reader
	done func()
	ran  bool
}

func (a *atEOF) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if err == io.EOF && !a.ran {
		a.ran = true
		a.done()
	}
	return n, err
}
