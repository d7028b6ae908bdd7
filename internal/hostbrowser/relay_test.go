package hostbrowser

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// relayFor serves the DevTools relay's relay for the browser at addr on a
// port of its own on 127.0.0.1, as the DevTools relay serves the guest's
// connections, and returns that port and the net log it writes.
func relayFor(t *testing.T, addr string) (port int, logPath string) {
	t.Helper()
	logPath = filepath.Join(t.TempDir(), "net.log")
	r := &bridge.CDPRelay{Addr: addr, VM: "test", LogPath: logPath, Log: hclog.NewNullLogger()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.Serve(ctx, c)
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, logPath
}

// cdp is a DevTools client on one WebSocket, speaking flat sessions.
type cdp struct {
	t    *testing.T
	c    *websocket.Conn
	next int
}

func dialCDP(t *testing.T, url string) *cdp {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("dialling %s: %v", url, err)
	}
	c.SetReadLimit(-1)
	t.Cleanup(func() { c.CloseNow() })
	return &cdp{t: t, c: c, next: 1}
}

// raw sends msg as it is and returns the answer to id, skipping events
// (those it is given a list for are kept there).
func (d *cdp) raw(msg string, id int, events *[]string) (result json.RawMessage, errMsg string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		d.t.Fatal(err)
	}
	for {
		_, b, err := d.c.Read(ctx)
		if err != nil {
			d.t.Fatalf("waiting for the answer to %s: %v", msg, err)
		}
		var a struct {
			ID     *int            `json:"id"`
			Method string          `json:"method"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(b, &a); err != nil {
			d.t.Fatalf("not JSON: %s", b)
		}
		if a.ID == nil {
			if events != nil {
				*events = append(*events, string(b))
			}
			continue
		}
		if *a.ID != id {
			continue
		}
		if a.Error != nil {
			return nil, a.Error.Message
		}
		return a.Result, ""
	}
}

// call sends method with params (in session sid, if any).
func (d *cdp) call(sid, method string, params map[string]any) (json.RawMessage, string) {
	d.t.Helper()
	id := d.next
	d.next++
	m := map[string]any{"id": id, "method": method, "params": params}
	if sid != "" {
		m["sessionId"] = sid
	}
	b, _ := json.Marshal(m)
	return d.raw(string(b), id, nil)
}

func (d *cdp) mustCall(sid, method string, params map[string]any) json.RawMessage {
	d.t.Helper()
	res, e := d.call(sid, method, params)
	if e != "" {
		d.t.Fatalf("%s: %s", method, e)
	}
	return res
}

func field(t *testing.T, raw json.RawMessage, name string) string {
	t.Helper()
	var m map[string]any
	json.Unmarshal(raw, &m)
	s, _ := m[name].(string)
	return s
}

// userBrowser starts a real Chromium as a user's own would run with a
// debugging port: a profile of the test's, none of the settings Launch
// writes, home as its $HOME. It returns the endpoint's address.
func userBrowser(t *testing.T, home string) string {
	t.Helper()
	chromium := testutil.Program(t, "chromium")
	port := testutil.FreePort(t)
	profile := t.TempDir()
	cmd := exec.Command(chromium, Args(profile, port, true, os.Geteuid() == 0)...)
	cmd.Env = append(os.Environ(), "HOME="+home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The browser and its helpers, all of them gone before the profile
	// (and home) are removed: a helper left writing there fails the
	// removal.
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := testutil.Poll(ctx, "the browser's helpers to end", func() bool { return len(proc.FindAll(usesProfile(profile))) == 0 }); err != nil {
			t.Log(err) // the profile's removal then says what is left
		}
	})
	addr := bridge.DevToolsAddr(port)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var err error
	if perr := testutil.Poll(ctx, "the browser's DevTools endpoint", func() bool { _, err = bridge.ProbeDevTools(ctx, addr); return err == nil }); perr != nil {
		t.Fatalf("%v: %v", perr, err)
	}
	return addr
}

// A real Chromium (a user's own, not the one Launch sets up) behind the
// DevTools relay's relay: the web passes, the host's files, downloads and
// the browser's own pages do not, and each refusal is a DevTools error
// the client reads and a line of the net log.
func TestRelayRefusesTheHost(t *testing.T) {
	home := t.TempDir() // where the browser would download to: $HOME/Downloads
	direct := userBrowser(t, home)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/download") {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Disposition", `attachment; filename="got.bin"`)
			fmt.Fprint(w, "downloaded")
			return
		}
		fmt.Fprint(w, "<!doctype html><title>web page</title>")
	}))
	defer site.Close()
	secret := filepath.Join(t.TempDir(), "secret.txt")
	os.WriteFile(secret, []byte("host-secret-42"), 0o644)
	port, logPath := relayFor(t, direct)
	relay := fmt.Sprintf("127.0.0.1:%d", port)

	// /json: the endpoints pass, their WebSocket URLs name the relay.
	resp, err := http.Get("http://" + relay + "/json/version")
	if err != nil {
		t.Fatal(err)
	}
	var version struct {
		WS string `json:"webSocketDebuggerUrl"`
	}
	json.NewDecoder(resp.Body).Decode(&version)
	resp.Body.Close()
	if !strings.HasPrefix(version.WS, "ws://"+relay+"/devtools/browser/") {
		t.Fatalf("/json/version through the relay: webSocketDebuggerUrl %q, want the relay's", version.WS)
	}
	for _, c := range []struct {
		query string
		code  int
	}{
		{"file://" + secret, http.StatusForbidden},
		{"file%3A%2F%2F" + strings.ReplaceAll(secret, "/", "%2F"), http.StatusForbidden},
		{"view-source:" + site.URL, http.StatusForbidden},
		{"chrome://settings", http.StatusForbidden},
		{site.URL + "/new", http.StatusOK},
	} {
		req, _ := http.NewRequest(http.MethodPut, "http://"+relay+"/json/new?"+c.query, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("PUT /json/new?%s: %d %s, want %d", c.query, resp.StatusCode, body, c.code)
		}
	}
	if resp, err := http.Get("http://" + relay + "/other"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /other: %v %v; want 404", resp, err)
	}

	b := dialCDP(t, version.WS)
	// A page starts a download by itself (before any call of the guest's
	// about downloads): the relay denied downloads when the session began,
	// and in the browser context the guest makes.
	b.mustCall("", "Target.createTarget", map[string]any{"url": site.URL + "/download/default"})
	bc := field(t, b.mustCall("", "Target.createBrowserContext", map[string]any{}), "browserContextId")
	b.mustCall("", "Target.createTarget", map[string]any{"url": site.URL + "/download/context", "browserContextId": bc})
	if _, e := b.raw(`{"id":-3,"method":"Browser.getVersion"}`, -3, nil); !strings.Contains(e, "ids below 0") {
		t.Errorf("a call with a negative id: %q; want refused", e)
	}

	// Target.createTarget: a web page, yes; a file, the browser's pages: no.
	target := field(t, b.mustCall("", "Target.createTarget", map[string]any{"url": site.URL + "/a"}), "targetId")
	for _, u := range []string{"file://" + secret, "view-source:file://" + secret, "chrome://settings", "devtools://devtools/bundled/inspector.html", " file://" + secret, "fi\tle://" + secret, "javascript:alert(1)"} {
		if _, e := b.call("", "Target.createTarget", map[string]any{"url": u}); !strings.Contains(e, "agent-vm refused Target.createTarget") {
			t.Errorf("Target.createTarget %q: error %q; want the relay's refusal", u, e)
		}
	}
	sid := field(t, b.mustCall("", "Target.attachToTarget", map[string]any{"targetId": target, "flatten": true}), "sessionId")
	b.mustCall(sid, "Page.enable", map[string]any{})
	if _, e := b.call(sid, "Page.navigate", map[string]any{"url": "file://" + secret}); !strings.Contains(e, "agent-vm refused Page.navigate") {
		t.Errorf("Page.navigate to a host file: %q; want refused", e)
	}
	// A key twice: the relay passes what it read (the last), so the
	// browser cannot read the other one.
	id := b.next
	b.next++
	if _, e := b.raw(fmt.Sprintf(`{"id":%d,"sessionId":%q,"method":"Page.navigate","params":{"url":%q,"url":%q}}`, id, sid, site.URL+"/b", "file://"+secret), id, nil); !strings.Contains(e, "agent-vm refused") {
		t.Errorf("a file: URL after a web one in the same call: %q; want refused", e)
	}
	id = b.next
	b.next++
	if _, e := b.raw(fmt.Sprintf(`{"id":%d,"sessionId":%q,"method":"Page.navigate","params":{"url":%q,"url":%q}}`, id, sid, "file://"+secret, site.URL+"/c"), id, nil); e != "" {
		t.Errorf("a web URL after a file: one: %q", e)
	}
	var href json.RawMessage
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := testutil.Poll(ctx, "the page to be at "+site.URL+"/c", func() bool {
		href = b.mustCall(sid, "Runtime.evaluate", map[string]any{"expression": "location.href", "returnByValue": true})
		return strings.Contains(string(href), site.URL+"/c")
	}); err != nil {
		t.Errorf("%v: after the twice-keyed call the page is at %s", err, href)
	}
	// Script in a web page cannot reach the file either (the browser's own
	// rule, which the relay leaves to it).
	if res := b.mustCall(sid, "Runtime.evaluate", map[string]any{"expression": "fetch('file://" + secret + "').then(r => r.text()).catch(e => 'failed')", "awaitPromise": true, "returnByValue": true}); strings.Contains(string(res), "host-secret-42") {
		t.Errorf("a web page read the host file: %s", res)
	}
	// Downloads: deny passes, anything else does not.
	if _, e := b.call("", "Browser.setDownloadBehavior", map[string]any{"behavior": "allow", "downloadPath": t.TempDir()}); !strings.Contains(e, "agent-vm refused") {
		t.Errorf("Browser.setDownloadBehavior allow: %q; want refused", e)
	}
	if _, e := b.call(sid, "Page.setDownloadBehavior", map[string]any{"behavior": "allow", "downloadPath": t.TempDir()}); !strings.Contains(e, "agent-vm refused") {
		t.Errorf("Page.setDownloadBehavior allow: %q; want refused", e)
	}
	b.mustCall("", "Browser.setDownloadBehavior", map[string]any{"behavior": "deny"})
	for _, m := range []string{"DOM.setFileInputFiles", "Browser.close", "Target.exposeDevToolsProtocol", "Extensions.loadUnpacked"} {
		if _, e := b.call("", m, map[string]any{"files": []string{secret}, "path": filepath.Dir(secret), "targetId": target}); !strings.Contains(e, "agent-vm refused "+m) {
			t.Errorf("%s: %q; want refused", m, e)
		}
	}

	// What the relay stands between: the browser itself opens a host file
	// for a DevTools client that reaches it directly.
	h := dialCDP(t, strings.Replace(version.WS, relay, direct, 1))
	ft := field(t, h.mustCall("", "Target.createTarget", map[string]any{"url": "file://" + secret}), "targetId")
	fsid := field(t, h.mustCall("", "Target.attachToTarget", map[string]any{"targetId": ft, "flatten": true}), "sessionId")
	var text json.RawMessage
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer pcancel()
	_ = testutil.Poll(pctx, "the host file shown", func() bool { // a miss is reported below
		text = h.mustCall(fsid, "Runtime.evaluate", map[string]any{"expression": "document.body && document.body.innerText", "returnByValue": true})
		return strings.Contains(string(text), "host-secret-42")
	})
	if !strings.Contains(string(text), "host-secret-42") {
		t.Errorf("directly, the browser did not show the host file (%s): the relay's refusals above prove less than they seem", text)
	}
	if _, e := b.call(fsid, "Runtime.evaluate", map[string]any{"expression": "1"}); e == "" {
		t.Errorf("the relay passed a call in a session of another client's")
	}

	// A page of the browser's own, opened behind the relay's back: a
	// session there may enable domains, not run script.
	own := field(t, h.mustCall("", "Target.createTarget", map[string]any{"url": "chrome://version"}), "targetId")
	osid := field(t, b.mustCall("", "Target.attachToTarget", map[string]any{"targetId": own, "flatten": true}), "sessionId")
	b.mustCall(osid, "Runtime.enable", map[string]any{})
	if _, e := b.call(osid, "Runtime.evaluate", map[string]any{"expression": "document.body.innerText"}); !strings.Contains(e, "not a web page") {
		t.Errorf("Runtime.evaluate in chrome://version: %q; want refused", e)
	}
	pd := dialCDP(t, "ws://"+relay+"/devtools/page/"+own)
	if _, e := pd.call("", "Runtime.evaluate", map[string]any{"expression": "1"}); !strings.Contains(e, "not a web page") {
		t.Errorf("Runtime.evaluate on chrome://version's own endpoint: %q; want refused", e)
	}
	if _, e := b.call("no-such-session", "Runtime.evaluate", map[string]any{"expression": "1"}); !strings.Contains(e, "has not told of") {
		t.Errorf("an unknown session: %q; want refused", e)
	}

	time.Sleep(2 * time.Second) // time passing is the test: the downloads would have landed by now
	if des, _ := os.ReadDir(filepath.Join(home, "Downloads")); len(des) > 0 {
		t.Errorf("the browser downloaded into the host's %s: %v", filepath.Join(home, "Downloads"), des)
	}

	es, err := egress.ReadLog(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range es {
		if e.Kind != egress.KindDevTools || e.Allowed {
			t.Errorf("log entry %+v: want refused devtools calls only", e)
		}
		lines = append(lines, e.Request+" "+e.URL)
	}
	joined := strings.Join(lines, "\n")
	for _, want := range []string{"Page.navigate file://" + secret, "Target.createTarget file://" + secret, "/json/new file://" + secret, "Browser.setDownloadBehavior", "Runtime.evaluate"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the net log lacks %q:\n%s", want, joined)
		}
	}
}

// The browser Launch starts keeps off the host by its own settings, for
// a client that reaches it directly: a file: page is blocked, a page's
// download is not saved.
func TestLaunchedBrowserDeniesTheHost(t *testing.T) {
	o := launchOptions(t)
	home := t.TempDir()
	t.Setenv("HOME", home)
	if _, err := Launch(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="got.bin"`)
		fmt.Fprint(w, "downloaded")
	}))
	defer site.Close()
	secret := filepath.Join(t.TempDir(), "secret.txt")
	os.WriteFile(secret, []byte("host-secret-42"), 0o644)
	v, err := bridge.ProbeDevTools(context.Background(), bridge.DevToolsAddr(o.Port))
	if err != nil {
		t.Fatal(err)
	}
	h := dialCDP(t, v.WebSocketURL)
	h.mustCall("", "Target.createTarget", map[string]any{"url": site.URL + "/download"})
	ft := field(t, h.mustCall("", "Target.createTarget", map[string]any{"url": "file://" + secret}), "targetId")
	fsid := field(t, h.mustCall("", "Target.attachToTarget", map[string]any{"targetId": ft, "flatten": true}), "sessionId")
	var text json.RawMessage
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer pcancel()
	_ = testutil.Poll(pctx, "the file: page to load or be blocked", func() bool { // a miss is reported below
		text = h.mustCall(fsid, "Runtime.evaluate", map[string]any{"expression": "document.body && document.body.innerText", "returnByValue": true})
		return strings.Contains(string(text), "host-secret-42") || strings.Contains(string(text), "blocked")
	})
	if strings.Contains(string(text), "host-secret-42") || !strings.Contains(string(text), "blocked") {
		t.Errorf("a file: page in the launched browser shows %s; want it blocked", text)
	}
	time.Sleep(2 * time.Second) // time passing is the test: no download lands meanwhile
	if des, _ := os.ReadDir(filepath.Join(home, "Downloads")); len(des) > 0 {
		t.Errorf("the launched browser downloaded into %s: %v", filepath.Join(home, "Downloads"), des)
	}
}
