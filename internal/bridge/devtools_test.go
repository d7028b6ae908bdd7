package bridge

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

// serve answers GET /json/version on 127.0.0.1 with status and body, and
// returns its address.
func serve(t *testing.T, status int, body string) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/json/version" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(s.Close)
	return s.Listener.Addr().String()
}

// What Chromium 126 answers, as it answers it.
const chromiumVersion = `{
   "Browser": "Chrome/126.0.6478.126",
   "Protocol-Version": "1.3",
   "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36",
   "V8-Version": "12.6.228.21",
   "WebKit-Version": "537.36 (@5e8c2d2bc7e0d4ec7ab52b4a3ba59e0fbee89e61)",
   "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/5a0e3a3c-0a36-4f4c-9f7e-6b7c2f6c9d51"
}`

func TestProbeDevToolsReadsTheVersion(t *testing.T) {
	addr := serve(t, http.StatusOK, chromiumVersion)
	d, err := ProbeDevTools(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	want := DevTools{Browser: "Chrome/126.0.6478.126", Protocol: "1.3",
		UserAgent:    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36",
		WebSocketURL: "ws://127.0.0.1:9222/devtools/browser/5a0e3a3c-0a36-4f4c-9f7e-6b7c2f6c9d51"}
	if d != want {
		t.Errorf("got %+v, want %+v", d, want)
	}
}

func TestProbeDevToolsSaysWhatIsWrong(t *testing.T) {
	free := DevToolsAddr(testutil.FreePort(t))
	for _, c := range []struct {
		name, addr string
		want       []string
	}{
		{"nothing listens", free, []string{"nothing answers on " + free + ": start Chrome/Chromium with --remote-debugging-port=" + portOf(free) + ", or agent-vm browser BRANCH --launch"}},
		{"another program", serve(t, http.StatusNotFound, "no"), []string{"not as a browser's DevTools endpoint", "404"}},
		{"not JSON", serve(t, http.StatusOK, "<html>"), []string{"not as a browser's DevTools endpoint", "not JSON"}},
		{"JSON of something else", serve(t, http.StatusOK, `{"ok": true}`), []string{"no Browser or webSocketDebuggerUrl"}},
		{"another host", "192.0.2.1:9222", []string{"not on this host's loopback"}},
		{"a name", "localhost:9222", []string{"not on this host's loopback"}},
		{"no port", "127.0.0.1", []string{"not HOST:PORT"}},
	} {
		_, err := ProbeDevTools(context.Background(), c.addr)
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", c.name, err, w)
			}
		}
	}
}

// An endpoint that accepts and never answers is given up on: the probe
// has its own time limit.
func TestProbeDevToolsGivesUpOnASilentPort(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the probe's time limit")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	_, err = ProbeDevTools(context.Background(), ln.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "does not answer within") {
		t.Errorf("err = %v, want one saying it does not answer", err)
	}
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	if _, err := strconv.Atoi(p); err != nil {
		panic(addr)
	}
	return p
}
