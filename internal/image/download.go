package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
)

// metaSuffix names the file beside a partial download that records what it
// is a part of, so a later run can resume it safely.
const metaSuffix = ".json"

// partialMeta identifies the resource a partial download belongs to.
type partialMeta struct {
	URL          string `json:"url"`
	ETag         string `json:"etag,omitempty"`
	LastModified string `json:"last_modified,omitempty"`
	Size         int64  `json:"size"` // -1 when the server did not say
}

// downloader fetches files over HTTP, resuming interrupted transfers.
type downloader struct {
	client   *http.Client
	out      io.Writer
	now      func() time.Time
	log      hclog.Logger
	attempts int
	backoff  time.Duration // before the first retry; doubles after each
	stall    time.Duration // a transfer that delivers nothing this long is retried
}

func defaultHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = 60 * time.Second
	// The body is read in full by the caller: no overall timeout, only the
	// downloader's stall watchdog.
	return &http.Client{Transport: t}
}

// statusError is an HTTP response that is not a success.
type statusError struct {
	URL    string
	Code   int
	Status string
}

func (e *statusError) Error() string {
	hint := "check the URL and your network"
	switch {
	case e.Code == http.StatusNotFound:
		hint = "the file is not on the server: check the base URL, or the image may have moved upstream"
	case e.Code >= 500:
		hint = "the server failed; try again later"
	case e.Code == http.StatusForbidden || e.Code == http.StatusUnauthorized:
		hint = "the server refused access; check the URL or your proxy"
	}
	return fmt.Sprintf("fetching %s: the server answered %s (hint: %s)", e.URL, e.Status, hint)
}

// retryable reports whether trying again may help: server errors and broken
// transfers, not client errors, checksum mismatches or cancellation.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var se *statusError
	if errors.As(err, &se) {
		return se.Code >= 500 || se.Code == http.StatusRequestTimeout || se.Code == http.StatusTooManyRequests
	}
	var ne net.Error
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errStalled) || errors.Is(err, errRestart) ||
		errors.As(err, &ne) || errors.Is(err, io.EOF) || strings.Contains(err.Error(), "connection reset")
}

var (
	errStalled = errors.New("the transfer stalled")
	errRestart = errors.New("the partial download cannot be resumed; starting over")
)

// retry runs f up to d.attempts times, backing off between tries, while its
// error is retryable.
func (d *downloader) retry(ctx context.Context, what string, f func() error) error {
	delay := d.backoff
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil || attempt >= d.attempts || !retryable(ctx, err) {
			return err
		}
		fmt.Fprintf(d.out, "==> %v; trying again in %s (attempt %d of %d)\n", err, delay, attempt+1, d.attempts)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-t.C:
		}
		delay *= 2
	}
}

// small fetches a small file (a checksum list) into memory.
func (d *downloader) small(ctx context.Context, url string, limit int64) ([]byte, error) {
	var body []byte
	err := d.retry(ctx, "fetching "+url, func() error {
		resp, err := d.get(ctx, url, nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return &statusError{URL: url, Code: resp.StatusCode, Status: resp.Status}
		}
		body, err = io.ReadAll(io.LimitReader(resp.Body, limit+1))
		if err != nil {
			return fmt.Errorf("fetching %s: %w", url, err)
		}
		if int64(len(body)) > limit {
			return fmt.Errorf("fetching %s: larger than %s, not a checksum list (hint: check the base URL)", url, formatBytes(limit))
		}
		return nil
	})
	return body, err
}

func (d *downloader) get(ctx context.Context, url string, header http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("fetching %s: %w", url, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", "agent-vm (image pull)")
	resp, err := d.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("fetching %s: %w", url, ctx.Err())
		}
		return nil, fmt.Errorf("fetching %s: %w", url, err)
	}
	return resp, nil
}

// fetch downloads url into part, resuming what an earlier attempt or run left
// there when the server supports ranges and the resource is unchanged. On
// failure the partial file is kept for the next run.
func (d *downloader) fetch(ctx context.Context, url, part string) (partialMeta, error) {
	var meta partialMeta
	err := d.retry(ctx, "downloading "+url, func() error {
		var err error
		meta, err = d.fetchOnce(ctx, url, part)
		return err
	})
	var se *statusError
	if fi, serr := os.Stat(part); err != nil && serr == nil && fi.Size() > 0 && ctx.Err() == nil && !errors.As(err, &se) {
		err = fmt.Errorf("%w (hint: run the pull again to resume the download)", err)
	}
	return meta, err
}

func (d *downloader) fetchOnce(ctx context.Context, url, part string) (partialMeta, error) {
	meta, have := resumable(part, url)
	header := http.Header{}
	if have > 0 {
		header.Set("Range", fmt.Sprintf("bytes=%d-", have))
		// If-Range makes the server send the whole, current file instead
		// when it changed since the partial download began.
		if meta.ETag != "" && !strings.HasPrefix(meta.ETag, "W/") {
			header.Set("If-Range", meta.ETag)
		} else {
			header.Set("If-Range", meta.LastModified)
		}
	}
	resp, err := d.get(ctx, url, header)
	if err != nil {
		return meta, err
	}
	defer resp.Body.Close()

	var f *os.File
	switch resp.StatusCode {
	case http.StatusOK:
		if have > 0 {
			fmt.Fprintln(d.out, "==> the server sent the whole file; starting over")
		}
		have = 0
		meta = partialMeta{URL: url, ETag: resp.Header.Get("ETag"), LastModified: resp.Header.Get("Last-Modified"), Size: resp.ContentLength}
		f, err = os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	case http.StatusPartialContent:
		start, total, ok := parseContentRange(resp.Header.Get("Content-Range"))
		etag := resp.Header.Get("ETag")
		if !ok || start != have || (meta.Size >= 0 && total != meta.Size) || (meta.ETag != "" && etag != "" && etag != meta.ETag) {
			discardPartial(part)
			return meta, errRestart
		}
		fmt.Fprintf(d.out, "==> resuming at %s of %s\n", formatBytes(have), formatBytes(total))
		f, err = os.OpenFile(part, os.O_WRONLY|os.O_APPEND, 0o644)
	case http.StatusRequestedRangeNotSatisfiable:
		if meta.Size >= 0 && have == meta.Size {
			return meta, nil // an earlier run got it all
		}
		discardPartial(part)
		return meta, errRestart
	default:
		return meta, &statusError{URL: url, Code: resp.StatusCode, Status: resp.Status}
	}
	if err != nil {
		return meta, err
	}
	defer f.Close()
	if err := writeMeta(part, meta); err != nil {
		return meta, err
	}
	n, err := d.copyWithProgress(ctx, f, resp.Body, have, meta.Size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return meta, fmt.Errorf("download of %s interrupted after %s: %w", url, formatBytes(have+n), err)
	}
	if meta.Size >= 0 && have+n != meta.Size {
		return meta, fmt.Errorf("download of %s ended after %s of %s: %w", url, formatBytes(have+n), formatBytes(meta.Size), io.ErrUnexpectedEOF)
	}
	return meta, nil
}

// resumable returns the partial download's metadata and length when it
// belongs to url and has a validator; otherwise it clears it and returns 0.
func resumable(part, url string) (partialMeta, int64) {
	fi, err := os.Stat(part)
	if err != nil {
		return partialMeta{URL: url, Size: -1}, 0
	}
	var meta partialMeta
	b, err := os.ReadFile(part + metaSuffix)
	if err == nil {
		err = json.Unmarshal(b, &meta)
	}
	if err != nil || meta.URL != url || (meta.ETag == "" && meta.LastModified == "") || (meta.Size >= 0 && fi.Size() > meta.Size) {
		discardPartial(part)
		return partialMeta{URL: url, Size: -1}, 0
	}
	return meta, fi.Size()
}

func writeMeta(part string, meta partialMeta) error {
	b, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	return atomicfile.Write(part+metaSuffix, b, 0o644)
}

// parseContentRange parses "bytes <start>-<end>/<total>".
func parseContentRange(s string) (start, total int64, ok bool) {
	rest, found := strings.CutPrefix(s, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	first, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	start, err1 := strconv.ParseInt(first, 10, 64)
	total, err2 := strconv.ParseInt(tot, 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return start, total, true
}

// copyWithProgress copies body to f, printing progress at most once a second
// and giving up when nothing arrives for d.stall.
func (d *downloader) copyWithProgress(ctx context.Context, f io.Writer, body io.Reader, have, total int64) (int64, error) {
	stalled := make(chan struct{})
	watchdog := time.AfterFunc(d.stall, func() { close(stalled) })
	defer watchdog.Stop()
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	pw := &progressWriter{out: d.out, now: d.now, have: have, total: total, start: d.now(), last: d.now(), onWrite: func() { watchdog.Reset(d.stall) }}
	go func() {
		n, err := io.Copy(io.MultiWriter(f, pw), body)
		done <- result{n, err}
	}()
	select {
	case r := <-done:
		pw.finish(r.err == nil)
		return r.n, r.err
	case <-stalled:
		// Closing the body (by our caller's defer) unblocks the copy; wait
		// for it so nothing writes to f afterwards.
		if c, ok := body.(io.Closer); ok {
			_ = c.Close()
		}
		r := <-done
		return r.n, fmt.Errorf("%w: nothing received for %s", errStalled, d.stall)
	case <-ctx.Done():
		if c, ok := body.(io.Closer); ok {
			_ = c.Close()
		}
		r := <-done
		return r.n, ctx.Err()
	}
}

// progressWriter counts bytes and prints "12.0 MiB / 500.0 MiB (2%), 3.1 MiB/s".
type progressWriter struct {
	out         io.Writer
	now         func() time.Time
	have, total int64 // bytes before this transfer; the whole file (-1 unknown)
	n           int64 // bytes in this transfer
	start, last time.Time
	onWrite     func()
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	p.onWrite()
	if now := p.now(); now.Sub(p.last) >= time.Second {
		p.last = now
		fmt.Fprintf(p.out, "    %s\n", p.line(now))
	}
	return len(b), nil
}

func (p *progressWriter) line(now time.Time) string {
	var s string
	if p.total > 0 {
		s = fmt.Sprintf("%s / %s (%d%%)", formatBytes(p.have+p.n), formatBytes(p.total), (p.have+p.n)*100/p.total)
	} else {
		s = formatBytes(p.have + p.n)
	}
	if el := now.Sub(p.start).Seconds(); el > 0 {
		s += fmt.Sprintf(", %s/s", formatBytes(int64(float64(p.n)/el)))
	}
	return s
}

func (p *progressWriter) finish(ok bool) {
	if !ok {
		return
	}
	now := p.now()
	fmt.Fprintf(p.out, "    %s, done in %s\n", p.line(now), now.Sub(p.start).Round(100*time.Millisecond))
}
