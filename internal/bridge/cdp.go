package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/egress"
)

// CDPRelay is the DevTools relay's host end: each guest connection is
// served as HTTP, the requests of a DevTools client (the /json endpoints
// and the WebSocket sessions of /devtools/) are checked and passed to the
// host browser's endpoint, and nothing else is. Through DevTools the
// browser does what it is told with the host user's rights, so the relay
// refuses what reaches the host outside the web pages:
//
//   - loading anything but http, https and about:blank: Page.navigate,
//     Target.createTarget, /json/new and Network.loadNetworkResource with
//     a file:, chrome:, devtools:, view-source:, javascript: or data: URL
//     (the browser reads the host's files for file: and view-source:file:);
//   - downloads: Browser.setDownloadBehavior and Page.setDownloadBehavior
//     other than "deny" (a download lands in any host directory a client
//     names); and since a page starts a download by itself (into the host
//     user's Downloads), the relay denies downloads itself when a session
//     begins and in each browser context the guest makes (Chromium 156
//     headless saves nothing in a new context anyway; a headed one may);
//   - handing the page the host's files: DOM.setFileInputFiles,
//     Page.handleFileChooser with files, Input.dispatchDragEvent dragging
//     files;
//   - the browser itself: Browser.close, Browser.crash,
//     Browser.crashGpuProcess, the Extensions and PWA domains (which load
//     extensions and apps from host paths), Target.exposeDevToolsProtocol
//     (which would let a page's script send DevTools calls past the relay)
//     and Target.sendMessageToTarget (calls wrapped in a string);
//   - the pages that are not the web's: a session with a target whose URL
//     is not http, https or about:blank (the user's chrome://settings, a
//     file: page, an extension's page) may only switch domains on and off,
//     let the target run, and navigate it to the web; anything that reads
//     or runs script in it is refused. The relay learns the targets' URLs
//     from the browser's own events (Target.attachedToTarget,
//     Target.targetInfoChanged), before the guest sees them, and a
//     /devtools/page/ID session's from /json/list.
//
// A refused call gets the DevTools error answer, with the reason, as if
// the browser had refused it, and a line in the VM's net log (KindDevTools).
// What it passes, it passes re-encoded from what it checked: a message
// whose keys the browser's parser would read otherwise than Go's (a key
// twice, a key in another case) reaches the browser as the relay read it.
// Binary WebSocket messages, which DevTools never sends, end the session.
type CDPRelay struct {
	// Addr is the host browser's DevTools endpoint (127.0.0.1:PORT).
	Addr string
	// VM is the VM's name, for messages; LogPath its net log ("" logs
	// nothing).
	VM      string
	LogPath string
	Log     hclog.Logger

	mu sync.Mutex // the net log's appends
}

// maxCDPMessage bounds one message of the guest's (a script to evaluate,
// a document to set); the browser's answers (screenshots) are not bounded.
const maxCDPMessage = 64 << 20

// cdpHeaderTimeout bounds reading one HTTP request's header.
const cdpHeaderTimeout = 30 * time.Second

// Serve serves one guest connection until it closes or ctx ends.
func (r *CDPRelay) Serve(ctx context.Context, c net.Conn) {
	l := &oneConn{conn: &closeNotifier{Conn: c, closed: make(chan struct{})}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { r.serveHTTP(ctx, w, req) }),
		ReadHeaderTimeout: cdpHeaderTimeout, ErrorLog: r.Log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug})}
	stop := context.AfterFunc(ctx, func() { srv.Close(); c.Close() })
	defer stop()
	_ = srv.Serve(l)
}

func (r *CDPRelay) serveHTTP(ctx context.Context, w http.ResponseWriter, req *http.Request) {
	p := req.URL.Path
	switch {
	case strings.HasPrefix(p, "/devtools/") && req.Method == http.MethodGet:
		r.session(ctx, w, req)
	case p == "/json/new":
		// The browser reads the query, unescaped, as the URL to open.
		u, err := url.QueryUnescape(req.URL.RawQuery)
		why := checkNavigation(req.URL.RawQuery)
		if err != nil {
			why = "the URL's escapes do not read"
		} else if why == "" {
			why = checkNavigation(u)
		}
		if why != "" {
			r.refuseHTTP(w, "/json/new", req.URL.RawQuery, why)
			return
		}
		r.forward(ctx, w, req)
	case (p == "/json" || p == "/json/list" || p == "/json/version" || p == "/json/protocol") && req.Method == http.MethodGet,
		strings.HasPrefix(p, "/json/activate/"), strings.HasPrefix(p, "/json/close/"):
		r.forward(ctx, w, req)
	default:
		http.Error(w, "agent-vm's DevTools relay passes the DevTools endpoints (/json/..., /devtools/...) only", http.StatusNotFound)
	}
}

// forward passes an HTTP request to the browser's endpoint and its answer
// back. The Host header stays the guest's, so the WebSocket URLs the
// browser answers with name the guest's end of the URL opener.
func (r *CDPRelay) forward(ctx context.Context, w http.ResponseWriter, req *http.Request) {
	out, err := http.NewRequestWithContext(ctx, req.Method, "http://"+r.Addr+req.URL.RequestURI(), nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out.Host = req.Host
	resp, err := noProxy.Do(out)
	if err != nil {
		r.Log.Warn("the DevTools relay could not reach the host browser", "addr", r.Addr, "error", err)
		http.Error(w, "the host browser's DevTools endpoint does not answer", http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// refuseHTTP answers a refused /json request and logs it.
func (r *CDPRelay) refuseHTTP(w http.ResponseWriter, what, rawURL, why string) {
	r.logRefusal(what, rawURL, why)
	http.Error(w, "agent-vm refused: "+why, http.StatusForbidden)
}

// session relays one DevTools WebSocket session: the guest's calls
// checked, the browser's answers and events passed as they are, after the
// targets they tell of are noted.
func (r *CDPRelay) session(ctx context.Context, w http.ResponseWriter, req *http.Request) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := &targets{sessions: map[string]string{}, urls: map[string]string{}, contexts: map[int64]bool{}}
	if id, ok := strings.CutPrefix(req.URL.Path, "/devtools/page/"); ok {
		u, found, err := r.targetURL(ctx, id)
		switch {
		case err != nil:
			r.Log.Warn("the DevTools relay could not list the host browser's targets", "addr", r.Addr, "error", err)
			http.Error(w, "the host browser's DevTools endpoint does not answer", http.StatusBadGateway)
			return
		case !found:
			http.Error(w, "no such target", http.StatusNotFound)
			return
		}
		t.page, t.urls[id] = id, u
	}
	host, _, err := websocket.Dial(ctx, "ws://"+r.Addr+req.URL.RequestURI(), &websocket.DialOptions{HTTPClient: noProxy, Host: req.Host})
	if err != nil {
		r.Log.Warn("the DevTools relay could not open a session with the host browser", "addr", r.Addr, "path", req.URL.Path, "error", err)
		http.Error(w, "the host browser refused the DevTools session", http.StatusBadGateway)
		return
	}
	defer host.CloseNow()
	g, err := websocket.Accept(w, req, nil)
	if err != nil {
		return // Accept answered the guest
	}
	defer g.CloseNow()
	host.SetReadLimit(-1)
	g.SetReadLimit(maxCDPMessage)
	t.host = host
	// Downloads land in the host user's directory unless denied (a page
	// starts one by itself, no DevTools call needed): denied for the
	// session's target, and for each browser context the guest makes.
	if t.page != "" {
		t.own(ctx, "Page.setDownloadBehavior", map[string]any{"behavior": "deny"})
	} else {
		t.own(ctx, "Browser.setDownloadBehavior", map[string]any{"behavior": "deny"})
	}

	var toGuest sync.Mutex // the browser's messages and the refusals, whole
	send := func(typ websocket.MessageType, b []byte) error {
		toGuest.Lock()
		defer toGuest.Unlock()
		return g.Write(ctx, typ, b)
	}
	go func() {
		defer cancel()
		for {
			typ, b, err := host.Read(ctx)
			if err != nil {
				return
			}
			if t.note(ctx, b) {
				continue // the answer to a call of the relay's own
			}
			if send(typ, b) != nil {
				return
			}
		}
	}()
	for {
		typ, b, err := g.Read(ctx)
		if err != nil {
			return
		}
		if typ != websocket.MessageText {
			g.Close(websocket.StatusUnsupportedData, "DevTools messages are JSON text")
			return
		}
		msg, answer := r.check(b, t)
		if answer != nil {
			if send(websocket.MessageText, answer) != nil {
				return
			}
			continue
		}
		if host.Write(ctx, websocket.MessageText, msg) != nil {
			return
		}
	}
}

// targetURL asks the browser's /json/list for target id's URL.
func (r *CDPRelay) targetURL(ctx context.Context, id string) (u string, found bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.Addr+"/json/list", nil)
	if err != nil {
		return "", false, err
	}
	resp, err := noProxy.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	var list []struct {
		ID  string `json:"id"`
		URL string `json:"url"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list); err != nil {
		return "", false, fmt.Errorf("GET /json/list: %w", err)
	}
	for _, x := range list {
		if x.ID == id {
			return x.URL, true, nil
		}
	}
	return "", false, nil
}

// targets are what one session knows of the browser's targets: the
// sessions attached to them and their URLs, from the browser's events.
type targets struct {
	host     *websocket.Conn // the browser's end, for the relay's own calls
	mu       sync.Mutex
	page     string            // the target a /devtools/page/ID session is on
	sessions map[string]string // sessionId -> targetId
	urls     map[string]string // targetId -> URL
	contexts map[int64]bool    // ids of the guest's Target.createBrowserContext calls
	ownID    int64             // the last id of the relay's own calls: -1, -2, ...
}

// own sends a call of the relay's own to the browser, with an id below
// 0 (the guest's are 0 or more); its answer goes no further (note).
func (t *targets) own(ctx context.Context, method string, params map[string]any) {
	t.mu.Lock()
	t.ownID--
	id := t.ownID
	t.mu.Unlock()
	b, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	_ = t.host.Write(ctx, websocket.MessageText, b)
}

// note reads a browser message for what the relay keeps of it: the
// targets events tell of, the browser contexts the guest made (whose
// downloads it then denies), and the answers to its own calls, which it
// reports so that they go no further. Only the messages that may be one
// of those are decoded: the rest (screenshots among them) pass by.
func (t *targets) note(ctx context.Context, b []byte) (own bool) {
	target := bytes.Contains(b, []byte(`"Target.`))
	browserContext := bytes.Contains(b, []byte(`"browserContextId"`))
	answer := bytes.Contains(b, []byte(`"id":-`))
	if !target && !browserContext && !answer {
		return false
	}
	var m struct {
		ID     *int64 `json:"id"`
		Method string `json:"method"`
		Result struct {
			BrowserContextID string `json:"browserContextId"`
		} `json:"result"`
		Params struct {
			SessionID  string `json:"sessionId"`
			TargetInfo struct {
				TargetID string `json:"targetId"`
				URL      string `json:"url"`
			} `json:"targetInfo"`
		} `json:"params"`
	}
	if json.Unmarshal(b, &m) != nil {
		return false
	}
	if m.ID != nil && *m.ID < 0 {
		return true
	}
	t.mu.Lock()
	info := m.Params.TargetInfo
	switch m.Method {
	case "Target.attachedToTarget":
		t.sessions[m.Params.SessionID] = info.TargetID
		t.urls[info.TargetID] = info.URL
	case "Target.targetInfoChanged", "Target.targetCreated":
		t.urls[info.TargetID] = info.URL
	case "Target.detachedFromTarget":
		delete(t.sessions, m.Params.SessionID)
	}
	made := m.ID != nil && t.contexts[*m.ID] && m.Result.BrowserContextID != ""
	if m.ID != nil {
		delete(t.contexts, *m.ID)
	}
	t.mu.Unlock()
	if made {
		t.own(ctx, "Browser.setDownloadBehavior", map[string]any{"behavior": "deny", "browserContextId": m.Result.BrowserContextID})
	}
	return false
}

// of is the URL of the target a call in session sid is for ("": the
// connection's own: a page's, or the browser's, which is not a page);
// known is false for a session the browser never told of.
func (t *targets) of(sid string) (id, u string, known bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id = t.page
	if sid != "" {
		if id, known = t.sessions[sid]; !known {
			return "", "", false
		}
	} else if id == "" {
		return "", "about:blank", true // the browser's own session: no page
	}
	u, known = t.urls[id]
	return id, u, known
}

// becomesWeb says whether target id, whose URL u is not the web's, is a
// web page by now or within newTabWait: a new tab is the browser's own
// page (chrome://new-tab-page...) until about:blank or the URL asked for
// commits, and a client's first calls on it come in that moment. The
// session's calls wait meanwhile, in order.
func (t *targets) becomesWeb(r *CDPRelay, id, u string) bool {
	deadline := time.Now().Add(newTabWait)
	for {
		if checkNavigation(t.now(context.Background(), r, id, u)) == "" {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newTabWait bounds becomesWeb's wait.
const newTabWait = 3 * time.Second

// now is target id's URL as the browser lists it now, noted for the
// session's later calls; u as it was known when the browser cannot say.
func (t *targets) now(ctx context.Context, r *CDPRelay, id, u string) string {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	cur, found, err := r.targetURL(ctx, id)
	if err != nil || !found {
		return u
	}
	t.mu.Lock()
	t.urls[id] = cur
	t.mu.Unlock()
	return cur
}

// inert are the calls a session with a page that is not the web's may
// make: switching domains on and off, letting the target run, leaving it,
// navigating it (to the web: Page.navigate is checked as any).
func inert(method string) bool {
	domain, name, _ := strings.Cut(method, ".")
	switch {
	case name == "enable" || name == "disable", domain == "Target",
		method == "Runtime.runIfWaitingForDebugger", method == "Page.getFrameTree",
		method == "Page.setLifecycleEventsEnabled", method == "Page.navigate":
		return true
	}
	return false
}

// check reads one of the guest's DevTools calls: the message to pass on
// (re-encoded from what was read), or the error answer to send back.
func (r *CDPRelay) check(b []byte, t *targets) (msg, answer []byte) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var call map[string]any
	if err := d.Decode(&call); err != nil || d.More() {
		return nil, cdpError(nil, nil, "agent-vm's DevTools relay reads JSON objects only")
	}
	method, _ := call["method"].(string)
	params, _ := call["params"].(map[string]any)
	why := checkCall(method, params)
	num, _ := call["id"].(json.Number)
	id, idErr := num.Int64()
	switch {
	case idErr != nil:
		why = "its id is not an integer"
	case id < 0:
		why = "ids below 0 are agent-vm's own"
	case method == "Target.createBrowserContext":
		t.mu.Lock()
		t.contexts[id] = true
		t.mu.Unlock()
	}
	if why == "" {
		sid, isString := call["sessionId"].(string)
		if _, ok := call["sessionId"]; ok && (!isString || sid == "") {
			why = "its sessionId is not a session's"
		} else if target, u, known := t.of(sid); !known {
			why = "it names a session the browser has not told of"
		} else if checkNavigation(u) != "" && !inert(method) && !t.becomesWeb(r, target, u) {
			why = "its target is " + targetWords(u) + ", not a web page: a session there may only enable domains, let it run or navigate it to the web"
		}
	}
	if why != "" {
		r.logRefusal(method, callURL(method, params), why)
		return nil, cdpError(call["id"], call["sessionId"], "agent-vm refused "+method+": "+why)
	}
	msg, err := json.Marshal(call)
	if err != nil {
		return nil, cdpError(call["id"], call["sessionId"], "agent-vm's DevTools relay could not pass the message on: "+err.Error())
	}
	return msg, nil
}

// targetWords names a target's URL that is not the web's by its scheme.
func targetWords(u string) string {
	if i := strings.IndexByte(u, ':'); i > 0 && i < 20 {
		return "a " + strings.ToLower(u[:i]) + ": page of the host's browser"
	}
	return "a page of the host's browser"
}

// cdpError is DevTools' error answer to call id (in session sid, when
// the call named one).
func cdpError(id, sid any, message string) []byte {
	e := map[string]any{"id": id, "error": map[string]any{"code": -32000, "message": message}}
	if sid != nil {
		e["sessionId"] = sid
	}
	b, _ := json.Marshal(e)
	return b
}

// refusedMethods are refused whatever their parameters, with the reason.
var refusedMethods = map[string]string{
	"DOM.setFileInputFiles":   "it hands the page files of the host",
	"Browser.close":           "it closes the host's browser",
	"Browser.crash":           "it crashes the host's browser",
	"Browser.crashGpuProcess": "it crashes the host's browser's GPU process",
	// A page's script could send DevTools calls past the relay.
	"Target.exposeDevToolsProtocol": "it lets a page's script drive the browser past agent-vm's checks",
	// Calls wrapped in a string, for sessions that are not flat.
	"Target.sendMessageToTarget": "agent-vm relays flat sessions only (Target.attachToTarget with flatten: true)",
}

// refusedDomains are refused whole: both load code from host paths.
var refusedDomains = map[string]string{
	"Extensions": "extensions are loaded from the host's files",
	"PWA":        "apps are installed from host files and onto the host",
}

// checkCall says why a DevTools call is refused ("" when it may pass).
func checkCall(method string, params map[string]any) string {
	if why, ok := refusedMethods[method]; ok {
		return why
	}
	domain, _, _ := strings.Cut(method, ".")
	if why, ok := refusedDomains[domain]; ok {
		return why
	}
	switch method {
	case "Page.navigate", "Target.createTarget", "Network.loadNetworkResource":
		u, _ := params["url"].(string)
		return checkNavigation(u)
	case "Browser.setDownloadBehavior", "Page.setDownloadBehavior":
		if b, _ := params["behavior"].(string); b != "deny" {
			return fmt.Sprintf("downloads land on the host: only behavior \"deny\" passes, not %q", clip(b))
		}
	case "Page.handleFileChooser":
		if files, _ := params["files"].([]any); len(files) > 0 {
			return "it hands the page files of the host"
		}
	case "Input.dispatchDragEvent":
		if data, _ := params["data"].(map[string]any); data != nil {
			if files, _ := data["files"].([]any); len(files) > 0 {
				return "it drags files of the host into the page"
			}
		}
	}
	return ""
}

// callURL is the URL a call loads, for the log ("" for none).
func callURL(method string, params map[string]any) string {
	if method == "Page.navigate" || method == "Target.createTarget" || method == "Network.loadNetworkResource" {
		u, _ := params["url"].(string)
		return u
	}
	return ""
}

// checkNavigation says why the browser may not load raw: only http and
// https URLs (as the URL opener takes them: no blanks or control
// characters, which a browser drops from a URL before it reads the
// scheme) and about:blank. "" for an empty URL (a new blank tab).
func checkNavigation(raw string) string {
	if raw == "" || raw == "about:blank" {
		return ""
	}
	if _, err := parseURL(raw); err != nil {
		scheme := "this URL"
		if i := strings.IndexByte(raw, ':'); i > 0 && i < 20 {
			scheme = "a " + strings.ToLower(clip(raw[:i])) + ": URL"
		}
		return fmt.Sprintf("the host's browser loads http, https and about:blank only, not %s (%v)", scheme, err)
	}
	return ""
}

// clip shortens what the guest sent for a message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// logRefusal writes a refused call into the VM's net log: the method, the
// URL as LogURL keeps it (scheme://host/path), the reason.
func (r *CDPRelay) logRefusal(method, rawURL, why string) {
	r.Log.Warn("the DevTools relay refused a call", "method", method, "reason", why)
	e := egress.LogEntry{Time: time.Now().UTC(), Kind: egress.KindDevTools, Request: method, Rule: why}
	if u, err := url.Parse(rawURL); err == nil && rawURL != "" {
		e.Host, e.URL = u.Hostname(), LogURL(u)
	}
	if err := appendLog(r.LogPath, &r.mu, e); err != nil {
		r.Log.Warn("logging a DevTools refusal", "vm", r.VM, "error", err)
	}
}

// oneConn is a listener of one connection, for an http.Server that
// serves it: Accept returns it once, then waits for it to close.
type oneConn struct {
	conn *closeNotifier
	once sync.Once
}

func (l *oneConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.conn })
	if c != nil {
		return c, nil
	}
	<-l.conn.closed
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error   { return nil }
func (l *oneConn) Addr() net.Addr { return l.conn.LocalAddr() }

// closeNotifier closes closed when the connection is closed, by the
// server or by a handler that took it over (a WebSocket session).
type closeNotifier struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeNotifier) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
