package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"
)

// Reply is an HTTP answer as a scenario checks it.
type Reply struct {
	Status int
	// Body is the start of the body (4 KiB), trimmed.
	Body string
	// Reused says the request went on a connection the client had kept
	// from an earlier one.
	Reused bool
}

// HTTP makes one request with c (nil: a client of its own, no connection
// kept) within 15 s, or c's own timeout. A request that gets no answer is
// an error naming the method and the URL; any answer is a Reply.
func HTTP(ctx context.Context, c *http.Client, method, url string, body []byte, headers map[string]string) (Reply, error) {
	if c == nil {
		c = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	}
	if c.Timeout == 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
	}
	var r Reply
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { r.Reused = i.Reused }})
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return r, err
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return r, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	r.Status, r.Body = resp.StatusCode, strings.TrimSpace(string(b))
	return r, nil
}
