package bridge

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
)

// socketPair returns the two ends of a real unix socket pair: the guest's
// and the host's.
func socketPair(t *testing.T) (guestEnd, hostEnd *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// testOpener is a URLOpener whose notices are kept, logging in a temp directory.
type testOpener struct {
	*URLOpener
	mu      sync.Mutex
	notices []string
}

func newTestOpener(t *testing.T, open bool, run *execxtest.Fake) *testOpener {
	d := &testOpener{}
	d.URLOpener = &URLOpener{VM: "feat-x", Open: open, Run: run, LogPath: filepath.Join(t.TempDir(), egress.LogFile),
		Notify: func(line string) { d.mu.Lock(); d.notices = append(d.notices, line); d.mu.Unlock() }}
	return d
}

func (d *testOpener) lastNotice() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.notices) == 0 {
		return ""
	}
	return d.notices[len(d.notices)-1]
}

// ask sends what the guest writes (a URL line, or anything) and returns
// the host's answer and Serve's error.
func ask(t *testing.T, d *testOpener, written string) (string, error) {
	t.Helper()
	g, h := socketPair(t)
	errc := make(chan error, 1)
	go func() { errc <- d.Serve(context.Background(), h) }()
	if _, err := io.WriteString(g, written); err != nil {
		t.Fatal(err)
	}
	answer, err := io.ReadAll(g)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(string(answer), "\n"), <-errc
}

// logged reads the opener's log back as `agent-vm net log` does.
func logged(t *testing.T, d *testOpener) []egress.LogEntry {
	t.Helper()
	es, err := egress.ReadLog(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// opener is a FAKE host opener at the exec boundary: xdg-open, answering
// with code.
func opener(t *testing.T, code int) *execxtest.Fake {
	return execxtest.New(t).On(Opener, func(execxtest.Call) execxtest.Reply { return execxtest.Reply{ExitCode: code} })
}

func TestAllowedURLIsOpenedWithTheHostsOpener(t *testing.T) {
	run := opener(t, 0)
	d := newTestOpener(t, true, run)
	got, err := ask(t, d, "https://example.test/x\n")
	if err != nil || got != "ok opened" {
		t.Fatalf("answer %q, error %v; want \"ok opened\"", got, err)
	}
	calls := run.Calls()
	if len(calls) != 1 || !calls[0].Detached || calls[0].Path+" "+strings.Join(calls[0].Args, " ") != "xdg-open https://example.test/x" {
		t.Fatalf("ran %+v, want one detached `xdg-open https://example.test/x`", calls)
	}
	if n := d.lastNotice(); !strings.Contains(n, "feat-x opened https://example.test/x") {
		t.Errorf("notice %q", n)
	}
	es := logged(t, d)
	if len(es) != 1 {
		t.Fatalf("log %+v, want one entry", es)
	}
	e := es[0]
	if e.Kind != egress.KindOpenURL || e.Host != "example.test" || e.Port != 443 || !e.Allowed || e.Rule != "opened" || e.URL != "https://example.test/x" {
		t.Errorf("log entry %+v", e)
	}
}

func TestURLIsOnlyPrintedWhenOpeningIsOff(t *testing.T) {
	run := execxtest.New(t) // any call fails the test
	d := newTestOpener(t, false, run)
	got, err := ask(t, d, "http://example.test:8080/login?state=abc\n")
	if err != nil || got != "ok printed" {
		t.Fatalf("answer %q, error %v; want \"ok printed\"", got, err)
	}
	if len(run.Calls()) != 0 {
		t.Errorf("ran %+v with opening off", run.Calls())
	}
	// The user sees the whole URL, query and all: they may open it.
	if n := d.lastNotice(); !strings.Contains(n, "http://example.test:8080/login?state=abc") || !strings.Contains(n, "agent-vm browser feat-x --open-urls") {
		t.Errorf("notice %q", n)
	}
	es := logged(t, d)
	if len(es) != 1 || es[0].Port != 8080 || !es[0].Allowed || es[0].Rule != "printed: opening is off" || es[0].URL != "http://example.test:8080/login" {
		t.Errorf("log %+v", es)
	}
}

func TestURLIsPrintedWhenTheOpenerIsMissingOrFails(t *testing.T) {
	missing := execxtest.New(t).Installed(Opener, "")
	d := newTestOpener(t, true, missing)
	if got, err := ask(t, d, "https://example.test/\n"); err != nil || got != "ok printed" {
		t.Fatalf("no opener: answer %q, error %v", got, err)
	}
	if es := logged(t, d); len(es) != 1 || !strings.Contains(es[0].Rule, "xdg-open is not on this host's PATH (Debian package xdg-utils)") {
		t.Errorf("no opener: log %+v", es)
	}

	d = newTestOpener(t, true, opener(t, 3))
	if got, err := ask(t, d, "https://example.test/\n"); err != nil || got != "ok printed" {
		t.Fatalf("failing opener: answer %q, error %v", got, err)
	}
	if n := d.lastNotice(); !strings.Contains(n, "xdg-open failed (exit status 3)") {
		t.Errorf("failing opener: notice %q", n)
	}
}

func TestRefusedURLs(t *testing.T) {
	cases := []struct{ url, want string }{
		{"file:///etc/passwd", "file: URLs are not opened"},
		{"javascript:alert(1)", "javascript: URLs are not opened"},
		{"data:text/html,<script>alert(1)</script>", "data: URLs are not opened"},
		{"ftp://example.test/f", "ftp: URLs are not opened"},
		{"vscode://open?x=1", "vscode: URLs are not opened"},
		{"example.test/x", "not an absolute URL"},
		{"https:///x", "names no host"},
		{"https:example.test", "names no host"},
		{"https://example.test/a b", "blank character"},
		{"https://example.test/\x1b[2J", "control"},
		{"https://example.test/\u202egnp.exe", "formatting"},
		{"https://exa%zz/", "not a URL"},
		{"", "no URL given"},
		{"https://example.test/" + strings.Repeat("a", MaxURL), "longer than the 8192 bytes allowed"},
	}
	for _, c := range cases {
		d := newTestOpener(t, true, execxtest.New(t))
		got, err := ask(t, d, c.url+"\n")
		if err != nil || !strings.HasPrefix(got, "refused: ") || !strings.Contains(got, c.want) {
			t.Errorf("%.60q: answer %q, error %v; want a refusal saying %q", c.url, got, err, c.want)
		}
		if es := logged(t, d); len(es) != 1 || es[0].Allowed || es[0].Kind != egress.KindOpenURL || es[0].Rule != got {
			t.Errorf("%.60q: log %+v", c.url, es)
		}
		if n := d.lastNotice(); strings.ContainsAny(n, "\x1b\u202e") {
			t.Errorf("%.60q: notice %q carries the guest's control characters", c.url, n)
		}
	}
	if err := CheckURL("HTTPS://Example.test/ok"); err != nil {
		t.Errorf("CheckURL of an upper-case scheme: %v", err)
	}
}

func TestALineNeverEndedIsRefusedAtTheDeadline(t *testing.T) {
	d := newTestOpener(t, true, execxtest.New(t))
	d.Timeout = 200 * time.Millisecond
	g, h := socketPair(t)
	errc := make(chan error, 1)
	go func() { errc <- d.Serve(context.Background(), h) }()
	if _, err := io.WriteString(g, "https://example.test/never-ends"); err != nil {
		t.Fatal(err)
	}
	g.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, err := io.ReadAll(g)
	if err != nil {
		t.Fatalf("the guest got no answer: %v", err)
	}
	if want := "refused: no whole line with a URL came within 200ms\n"; string(answer) != want {
		t.Errorf("answer %q, want %q", answer, want)
	}
	if err := <-errc; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

func TestAnEndedConnectionWithoutALineIsRefused(t *testing.T) {
	d := newTestOpener(t, true, execxtest.New(t))
	g, h := socketPair(t)
	errc := make(chan error, 1)
	go func() { errc <- d.Serve(context.Background(), h) }()
	io.WriteString(g, "https://example.test/")
	g.CloseWrite()
	answer, _ := io.ReadAll(g)
	if !strings.HasPrefix(string(answer), "refused: the connection ended") {
		t.Errorf("answer %q", answer)
	}
	<-errc
}

func TestURLsAreRateLimited(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	run := opener(t, 0)
	d := newTestOpener(t, true, run)
	d.Now = func() time.Time { return now }
	for i := range RateBurst {
		if got, err := ask(t, d, "https://example.test/\n"); err != nil || got != "ok opened" {
			t.Fatalf("URL %d of a burst: answer %q, error %v", i+1, got, err)
		}
	}
	got, err := ask(t, d, "https://example.test/sixth\n")
	if err != nil || !strings.HasPrefix(got, "refused: too many URLs") {
		t.Fatalf("the 6th URL of a burst: answer %q, error %v", got, err)
	}
	if n := len(run.Calls()); n != RateBurst {
		t.Errorf("opened %d URLs, want %d", n, RateBurst)
	}
	now = now.Add(RateEvery - time.Second)
	if got, _ := ask(t, d, "https://example.test/\n"); !strings.HasPrefix(got, "refused: too many URLs") {
		t.Errorf("before a token came back: answer %q", got)
	}
	now = now.Add(time.Second)
	if got, _ := ask(t, d, "https://example.test/\n"); got != "ok opened" {
		t.Errorf("a token later: answer %q", got)
	}
	es := logged(t, d)
	if len(es) != RateBurst+3 || es[RateBurst].Allowed || es[RateBurst].URL != "https://example.test/sixth" {
		t.Errorf("log %+v", es)
	}
}

func TestTheLogKeepsNoQueryNoFragmentNoPassword(t *testing.T) {
	d := newTestOpener(t, false, execxtest.New(t))
	if got, _ := ask(t, d, "https://user:hunter2@example.test/cb/%7Ex?code=SECRETCODE#access_token=SECRETTOKEN\n"); got != "ok printed" {
		t.Fatalf("answer %q", got)
	}
	raw, err := os.ReadFile(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"hunter2", "user", "SECRETCODE", "SECRETTOKEN"} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("the log holds %q:\n%s", secret, raw)
		}
	}
	if es := logged(t, d); len(es) != 1 || es[0].URL != "https://example.test/cb/%7Ex" || es[0].Host != "example.test" {
		t.Errorf("log %+v", es)
	}
}

func TestServeReturnsWhenCancelled(t *testing.T) {
	d := newTestOpener(t, true, execxtest.New(t))
	ctx, cancel := context.WithCancel(context.Background())
	_, h := socketPair(t)
	errc := make(chan error, 1)
	go func() { errc <- d.Serve(ctx, h) }()
	cancel()
	select {
	case <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still waits for the guest after its context ended")
	}
}

// listen serves d on a real unix socket in a temp directory.
func listenOpener(t *testing.T, d *testOpener) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "open-url.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go d.Serve(context.Background(), c)
		}
	}()
	return sock
}

func TestAskOpenEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := opener(t, 0)
	sock := listenOpener(t, newTestOpener(t, true, run))

	a, err := AskOpen(ctx, sock, "https://example.test/x")
	if err != nil || !a.Opened || a.Refused != "" {
		t.Fatalf("AskOpen: %+v, %v; want opened", a, err)
	}
	if calls := run.Calls(); len(calls) != 1 || calls[0].Args[0] != "https://example.test/x" {
		t.Errorf("ran %+v", calls)
	}
	a, err = AskOpen(ctx, sock, "file:///etc/passwd")
	if err != nil || a.Opened || !strings.Contains(a.Refused, "file: URLs are not opened") {
		t.Errorf("AskOpen of a file URL: %+v, %v", a, err)
	}
	if s := a.String(); !strings.HasPrefix(s, "the host refused the URL: file:") {
		t.Errorf("the refusal reads %q", s)
	}

	printed := listenOpener(t, newTestOpener(t, false, execxtest.New(t)))
	if a, err := AskOpen(ctx, printed, "https://example.test/x"); err != nil || a.Opened || a.Refused != "" {
		t.Errorf("AskOpen with opening off: %+v, %v; want printed", a, err)
	}

	if _, err := AskOpen(ctx, sock, "https://example.test/x\nfile:///etc/passwd"); err == nil {
		t.Error("AskOpen sent a URL with a line break")
	}
}

func TestAskOpenWithoutAnOpener(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := AskOpen(ctx, filepath.Join(dir, "open-url.sock"), "https://example.test/"); !errors.Is(err, ErrNoOpener) {
		t.Errorf("no socket: %v, want ErrNoOpener", err)
	}
	// A socket left behind by a holder that is gone: nobody accepts.
	sock := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := AskOpen(ctx, sock, "https://example.test/"); !errors.Is(err, ErrNoOpener) {
		t.Errorf("a stale socket: %v, want ErrNoOpener", err)
	}
}

func TestParseAnswer(t *testing.T) {
	for _, line := range []string{"", "ok maybe", "refusedx"} {
		if _, err := parseAnswer(line); err == nil {
			t.Errorf("parseAnswer(%q) took it", line)
		}
	}
	if a, err := parseAnswer("refused: it is \x1b[31mred\n"); err != nil || strings.Contains(a.Refused, "\x1b") {
		t.Errorf("parseAnswer kept the host's escape: %+v, %v", a, err)
	}
}
