package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// The URL opener's protocol, one request per connection to
// guest.OpenURLSocket:
//
//	guest: the URL, then "\n" (at most MaxURL bytes before it)
//	host:  one line, then it closes the connection:
//	       "ok opened"          opened with the host's opener (xdg-open)
//	       "ok printed"         shown to the host's user, not opened: the
//	                            user did not allow opening, or the host
//	                            has no opener
//	       "refused: <reason>"  not shown, not opened; the reason in
//	                            plain words
//
// The guest is not trusted: the host reads at most MaxURL+1 bytes and
// gives up after ReadTimeout, takes only absolute http and https URLs
// (CheckURL) and answers at most RateBurst URLs at once, then one per
// RateEvery.
const (
	MaxURL      = 8 << 10
	ReadTimeout = 10 * time.Second
	RateBurst   = 5
	RateEvery   = 6 * time.Second

	answerOpened  = "ok opened"
	answerPrinted = "ok printed"
	refusedPrefix = "refused: "
)

// Opener is the host program that opens a URL in the user's browser.
const Opener = "xdg-open"

// openerWait is how long Serve waits for the opener to fail before it
// answers "ok opened": xdg-open may run as long as the browser it starts.
const openerWait = 2 * time.Second

// CheckURL says why raw is not a URL the host opens: only absolute http
// and https URLs that name a host, of printable characters, at most MaxURL
// bytes. The words are for the user (no raw input is repeated but the
// scheme).
func CheckURL(raw string) error {
	_, err := parseURL(raw)
	return err
}

// parseURL is CheckURL that returns the parsed URL.
func parseURL(raw string) (*url.URL, error) {
	switch {
	case raw == "":
		return nil, errors.New("no URL given")
	case len(raw) > MaxURL:
		return nil, fmt.Errorf("the URL is %d bytes long, more than the %d allowed", len(raw), MaxURL)
	case !utf8.ValidString(raw):
		return nil, errors.New("the URL is not valid UTF-8")
	}
	for _, r := range raw {
		if unicode.IsControl(r) || unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) {
			return nil, fmt.Errorf("the URL contains a control, formatting or blank character (%U)", r)
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("not a URL: %v", err)
	}
	scheme := strings.ToLower(u.Scheme)
	switch {
	case scheme == "":
		return nil, errors.New("not an absolute URL (no scheme); only http and https URLs are opened")
	case scheme != "http" && scheme != "https":
		return nil, fmt.Errorf("%s: URLs are not opened on the host; only http and https URLs are", scheme)
	case u.Opaque != "" || u.Hostname() == "":
		return nil, fmt.Errorf("the %s URL names no host", scheme)
	}
	return u, nil
}

// URLOpener serves the host's end of a VM's URL opener: each connection is one
// URL, checked, rate-limited, logged in the VM's net log, shown to the user
// (Notify) and, if allowed, opened with Opener. Its methods may be called
// from several goroutines.
type URLOpener struct {
	// VM names the VM in notices.
	VM string
	// Open: the user allowed opening the VM's URLs with the host's opener;
	// otherwise they are only shown ("ok printed").
	Open bool
	// Run runs the opener: OpenerPath, else Opener found on PATH (the
	// holder records the path found where the user turned it on: its
	// own PATH may differ).
	Run        execx.Runner
	OpenerPath string
	// Notify, if set, is called with a one-line notice for the user; any
	// text of the guest's in it is made safe for a terminal.
	Notify func(line string)
	// LogPath is the VM's net log (internal/netpolicy.LogPath), where
	// every request is an egress.LogEntry of kind egress.KindOpenURL.
	LogPath string
	// Now is the clock of the rate limit; nil is time.Now.
	Now func() time.Time
	// Timeout bounds the wait for the guest's line; zero is ReadTimeout.
	Timeout time.Duration

	mu     sync.Mutex
	tokens float64   // the rate limit's bucket
	filled time.Time // when tokens was last brought up to date
	used   bool      // the bucket has been used (it starts full)
}

// Serve answers the one request on c and closes c. It never blocks longer
// than Timeout on the guest, plus the short wait for the opener. The
// guest is answered whatever happens, unless its connection had to be
// closed at the deadline (one without read deadlines); the error is what
// went wrong on the host's side (writing the log, answering).
func (d *URLOpener) Serve(ctx context.Context, c io.ReadWriteCloser) error {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = ReadTimeout
	}
	readCtx, cancel := context.WithTimeout(ctx, timeout)
	// At the deadline a blocked Read returns: a connection with read
	// deadlines (a unix socket) stays open for the answer; any other (an
	// SSH channel has none) is closed.
	stop := context.AfterFunc(readCtx, func() {
		if dl, ok := c.(interface{ SetReadDeadline(time.Time) error }); ok && dl.SetReadDeadline(time.Now()) == nil {
			return
		}
		c.Close()
	})
	raw, readErr := readLine(c)
	stop()
	if readErr != nil && readCtx.Err() != nil {
		readErr = fmt.Errorf("no whole line with a URL came within %s", timeout)
	}
	cancel()
	defer c.Close()

	var answer string
	var logErr error
	switch {
	case !d.take():
		// Not shown to the user: a flood of notices is what the limit
		// keeps from them.
		answer = refusedPrefix + fmt.Sprintf("too many URLs: at most %d at once, then one every %s", RateBurst, RateEvery)
		logErr = d.log(raw, nil, false, answer)
	case readErr != nil:
		answer = refusedPrefix + readErr.Error()
		logErr = d.log("", nil, false, answer)
		d.notify(fmt.Sprintf("VM %s asked to open a URL; refused: %s", d.VM, readErr))
	default:
		answer, logErr = d.handle(ctx, raw)
	}
	_, writeErr := io.WriteString(c, oneLine(answer)+"\n")
	if writeErr != nil {
		writeErr = fmt.Errorf("answering the guest: %w", writeErr)
	}
	return errors.Join(logErr, writeErr)
}

// handle answers one URL read whole.
func (d *URLOpener) handle(ctx context.Context, raw string) (answer string, err error) {
	u, perr := parseURL(raw)
	if perr != nil {
		answer = refusedPrefix + perr.Error()
		d.notify(fmt.Sprintf("VM %s asked to open a URL; refused: %s", d.VM, perr))
		return answer, d.log(raw, nil, false, answer)
	}
	shown := termsafe.String(raw)
	if !d.Open {
		d.notify(fmt.Sprintf("VM %s asks to open %s (not opened: on the host, run `agent-vm browser %s --open-urls` to let it)", d.VM, shown, d.VM))
		return answerPrinted, d.log(raw, u, true, "printed: opening is off")
	}
	if why := d.openURL(ctx, raw); why != "" {
		d.notify(fmt.Sprintf("VM %s asks to open %s (not opened: %s)", d.VM, shown, why))
		return answerPrinted, d.log(raw, u, true, "printed: "+why)
	}
	d.notify(fmt.Sprintf("VM %s opened %s in the host's browser", d.VM, shown))
	return answerOpened, d.log(raw, u, true, "opened")
}

// openURL runs the opener on raw; it says why the URL was not opened, or
// nothing. The opener runs detached, in a session of its own: the browser
// it may start must outlive the request.
func (d *URLOpener) openURL(ctx context.Context, raw string) (why string) {
	path := d.OpenerPath
	if path == "" {
		path = Opener
		if _, err := d.Run.LookPath(Opener); err != nil {
			hint := Opener + " is not on this host's PATH"
			if p, err := hostpkgs.Lookup(Opener); err == nil {
				hint += " (" + p.PackageHint() + ")"
			}
			return hint
		}
	}
	p, err := d.Run.Start(execx.Detached{Path: path, Args: []string{raw}, StdoutPath: os.DevNull})
	if err != nil {
		return fmt.Sprintf("%s did not start: %v", Opener, err)
	}
	t := time.NewTimer(openerWait)
	defer t.Stop()
	select {
	case <-p.Exited():
		if code := p.ExitCode(); code != 0 {
			return fmt.Sprintf("%s failed (exit status %d)", Opener, code)
		}
	case <-t.C:
	case <-ctx.Done():
	}
	return ""
}

// take takes a token from the rate limit's bucket: RateBurst at most, one
// more every RateEvery.
func (d *URLOpener) take() bool {
	now := time.Now()
	if d.Now != nil {
		now = d.Now()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.used {
		d.tokens, d.filled, d.used = RateBurst, now, true
	}
	if gained := now.Sub(d.filled); gained > 0 {
		d.tokens = min(RateBurst, d.tokens+float64(gained)/float64(RateEvery))
		d.filled = now
	}
	if d.tokens < 1 {
		return false
	}
	d.tokens--
	return true
}

// notify passes line to Notify, if set.
func (d *URLOpener) notify(line string) {
	if d.Notify != nil {
		d.Notify("agent-vm: " + termsafe.Line(line))
	}
}

// log appends one request to the VM's net log: of the URL only
// scheme://host/path (LogURL), of a URL that did not parse nothing.
func (d *URLOpener) log(raw string, u *url.URL, allowed bool, rule string) error {
	if u == nil {
		u, _ = parseURL(raw)
	}
	e := egress.LogEntry{Time: time.Now().UTC(), Kind: egress.KindOpenURL, Allowed: allowed, Rule: rule}
	if u != nil {
		e.Host, e.Port, e.URL = u.Hostname(), urlPort(u), LogURL(u)
	}
	if err := appendLog(d.LogPath, &d.mu, e); err != nil {
		return fmt.Errorf("logging a URL of VM %s: %w", d.VM, err)
	}
	return nil
}

// appendLog adds e to the VM's net log at path ("" logs nothing), one
// bridge's appends at a time (mu).
func appendLog(path string, mu *sync.Mutex, e egress.LogEntry) error {
	if path == "" {
		return nil
	}
	root, err := os.OpenRoot(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer root.Close()
	mu.Lock()
	defer mu.Unlock()
	return (&egress.Log{Dir: root, Name: filepath.Base(path)}).Add(e)
}

// LogURL is what the net log keeps of u: scheme://host/path, without a
// user name or password, query or fragment (OAuth codes and tokens ride
// in queries and fragments).
func LogURL(u *url.URL) string {
	return strings.ToLower(u.Scheme) + "://" + u.Host + u.EscapedPath()
}

// urlPort is u's port, given or the scheme's.
func urlPort(u *url.URL) int {
	if p, err := strconv.Atoi(u.Port()); err == nil {
		return p
	}
	if strings.EqualFold(u.Scheme, "http") {
		return 80
	}
	return 443
}

// readLine reads the request's line: up to "\n", at most MaxURL bytes
// before it. Its errors are the refusal's words.
func readLine(r io.Reader) (string, error) {
	long := fmt.Errorf("the URL is longer than the %d bytes allowed", MaxURL)
	buf := make([]byte, 0, 512)
	var chunk [512]byte
	for {
		n, err := r.Read(chunk[:])
		buf = append(buf, chunk[:n]...)
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			if i > MaxURL {
				return "", long
			}
			return strings.TrimSuffix(string(buf[:i]), "\r"), nil
		}
		if len(buf) > MaxURL {
			return "", long
		}
		if err != nil {
			return "", errors.New("the connection ended before the URL's line did")
		}
	}
}

// oneLine keeps an answer on its line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}
