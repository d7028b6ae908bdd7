package mcpproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

func TestChildCrashMidRequest(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	get := tp.do("GET", mcpPath, "", map[string]string{hdrSessionID: sid, "Accept": "text/event-stream"})
	defer get.Body.Close()
	stream := sseEvents(get.Body)

	// A request still waiting when the server dies gets a clear error too.
	var wg sync.WaitGroup
	wg.Add(1)
	var slow []json.RawMessage
	go func() {
		defer wg.Done()
		_, slow = tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":"slow","method":"sleep","params":{"ms":60000}}`)
	}()
	waitPending(t, tp, sid, 1)
	resp, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":"c","method":"crash"}`)
	if resp.StatusCode != 200 || len(msgs) != 1 {
		t.Fatalf("crash: status %d, messages %s", resp.StatusCode, msgs)
	}
	m := decode(t, msgs[0])
	if string(m.ID) != `"c"` || m.Error == nil || m.Error.Code != codeConnectionClosed ||
		!strings.Contains(m.Error.Message, `MCP server "t" exited (exit status 3) before answering`) || !strings.Contains(m.Error.Message, "start a new one") {
		t.Errorf("crash answered %s, want a JSON-RPC error saying the server exited", msgs[0])
	}
	wg.Wait()
	if len(slow) != 1 || decode(t, slow[0]).Error == nil {
		t.Errorf("the other waiting request got %s, want an error", slow)
	}
	if _, ok := nextEvent(t, stream); ok {
		t.Error("the GET stream stayed open after the server died")
	}
	if resp, _ := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":1,"method":"echo"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("request on the dead session: status %d, want 404", resp.StatusCode)
	}
	// A new session starts a new server.
	sid2 := tp.initialize(mcpPath)
	if _, msgs := tp.post(mcpPath, sid2, `{"jsonrpc":"2.0","id":1,"method":"echo"}`); len(msgs) != 1 || decode(t, msgs[0]).Result == nil {
		t.Errorf("echo on a new session: %s", msgs)
	}
}

// waitPending waits until the session has n requests in flight.
func waitPending(t *testing.T, tp *testProxy, sid string, n int) {
	t.Helper()
	tp.p.mu.Lock()
	s := tp.p.sessions[sid]
	tp.p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := 0
	if err := tu.Poll(ctx, fmt.Sprintf("%d requests pending", n), func() bool {
		s.mu.Lock()
		got = len(s.pending)
		s.mu.Unlock()
		return got >= n
	}); err != nil {
		t.Fatalf("%v: %d pending", err, got)
	}
}

func TestMalformedRequests(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	cases := []struct {
		name, body, ctype string
		status, code      int
	}{
		{"not JSON", `{"jsonrpc":"2.0",`, "application/json", 400, codeParseError},
		{"not JSON-RPC", `{"hello":1}`, "application/json", 400, codeInvalidRequest},
		{"no jsonrpc version", `{"id":1,"method":"echo"}`, "application/json", 400, codeInvalidRequest},
		{"null id", `{"jsonrpc":"2.0","id":null,"method":"echo"}`, "application/json", 400, codeInvalidRequest},
		{"object id", `{"jsonrpc":"2.0","id":{},"method":"echo"}`, "application/json", 400, codeInvalidRequest},
		{"empty batch", `[]`, "application/json", 400, codeInvalidRequest},
		{"bad batch element", `[{"jsonrpc":"2.0","id":1,"method":"echo"},3]`, "application/json", 400, codeInvalidRequest},
		{"a string", `"x"`, "application/json", 400, codeInvalidRequest},
		{"wrong content type", `{"jsonrpc":"2.0","id":1,"method":"echo"}`, "text/plain", 415, codeConnectionClosed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := tp.do("POST", mcpPath, c.body, map[string]string{hdrSessionID: sid, "Content-Type": c.ctype})
			msgs := readMessages(t, resp)
			if resp.StatusCode != c.status || len(msgs) != 1 {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, msgs, c.status)
			}
			if m := decode(t, msgs[0]); m.Error == nil || m.Error.Code != c.code || string(m.ID) != "null" {
				t.Errorf("body %s, want a JSON-RPC error %d with id null", msgs[0], c.code)
			}
		})
	}
	// The session survived all of that.
	if _, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":1,"method":"echo"}`); len(msgs) != 1 || decode(t, msgs[0]).Result == nil {
		t.Errorf("echo after bad requests: %s", msgs)
	}
}

func TestOversizedBody(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, func(o *Options) { o.MaxBodyBytes = 1024 })
	sid := tp.initialize(mcpPath)
	big := `{"jsonrpc":"2.0","id":1,"method":"echo","params":{"s":"` + strings.Repeat("x", 2048) + `"}}`
	resp, msgs := tp.post(mcpPath, sid, big)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "larger than 1024 bytes") {
		t.Errorf("status %d, body %s; want 413 naming the limit", resp.StatusCode, msgs)
	}
}

func TestOversizedServerMessageEndsSession(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, func(o *Options) { o.MaxMessageBytes = 4096 })
	sid := tp.initialize(mcpPath)
	if _, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":1,"method":"big","params":{"n":1000}}`); len(msgs) != 1 || decode(t, msgs[0]).Result == nil {
		t.Fatalf("small answer: %s", msgs)
	}
	_, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":2,"method":"big","params":{"n":10000}}`)
	if len(msgs) != 1 || decode(t, msgs[0]).Error == nil || !strings.Contains(decode(t, msgs[0]).Error.Message, "larger than 4096 bytes") {
		t.Errorf("oversized answer gave %s, want an error naming the limit", msgs)
	}
}

func TestAuthentication(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	init := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`
	for _, c := range []struct {
		name, auth, wantChallenge string
	}{
		{"missing", "", `Bearer realm="agent-vm mcp-proxy"`},
		{"wrong", "Bearer " + strings.Repeat("x", len(testToken)), `error="invalid_token"`},
		{"prefix of the token", "Bearer " + testToken[:10], `error="invalid_token"`},
		{"token plus more", "Bearer " + testToken + "x", `error="invalid_token"`},
		{"basic scheme", "Basic " + testToken, `error="invalid_token"`},
	} {
		for _, path := range []string{mcpPath, "/servers/t/sse", "/servers/t/messages?sessionId=x"} {
			method := "POST"
			if strings.HasSuffix(path, "/sse") {
				method = "GET"
			}
			hdr := map[string]string{"Authorization": c.auth}
			if c.auth == "" {
				hdr["Authorization"] = ""
			}
			resp := tp.do(method, path, init, hdr)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), c.wantChallenge) {
				t.Errorf("%s token, %s %s: status %d, WWW-Authenticate %q; want 401 with %q", c.name, method, path, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), c.wantChallenge)
			}
			if strings.Contains(string(body), testToken) {
				t.Errorf("the 401 body reveals the token: %s", body)
			}
		}
	}
	if n := len(childPids(t)); n != 0 {
		t.Errorf("refused requests started %d servers", n)
	}
	// Health needs no token.
	resp := tp.do("GET", "/health", "", map[string]string{"Authorization": ""})
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("health without token: status %d", resp.StatusCode)
	}
}

func TestOriginCheck(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, func(o *Options) {
		o.AllowedOrigins = []string{"https://claude.ai", "http://localhost:6274"}
	})
	init := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`
	for _, origin := range []string{"https://evil.example", "http://localhost:6275", "null", "https://claude.ai.evil.example"} {
		resp, msgs := func() (*http.Response, []json.RawMessage) {
			resp := tp.do("POST", mcpPath, init, map[string]string{"Origin": origin})
			return resp, readMessages(t, resp)
		}()
		if resp.StatusCode != http.StatusForbidden || len(msgs) != 1 || decode(t, msgs[0]).Error == nil {
			t.Errorf("origin %s: status %d, body %s; want 403 with a JSON-RPC error", origin, resp.StatusCode, msgs)
		}
		if resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("origin %s got CORS headers", origin)
		}
		pre := tp.do("OPTIONS", mcpPath, "", map[string]string{"Origin": origin, "Access-Control-Request-Method": "POST"})
		pre.Body.Close()
		if pre.StatusCode != http.StatusForbidden || pre.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("preflight from %s: status %d, ACAO %q; want 403 without CORS", origin, pre.StatusCode, pre.Header.Get("Access-Control-Allow-Origin"))
		}
	}
	if n := len(childPids(t)); n != 0 {
		t.Errorf("refused origins started %d servers", n)
	}

	// An allowed origin: preflight without token, then the real request.
	pre := tp.do("OPTIONS", mcpPath, "", map[string]string{"Origin": "https://claude.ai", "Access-Control-Request-Method": "POST", "Authorization": ""})
	pre.Body.Close()
	if pre.StatusCode != http.StatusNoContent || pre.Header.Get("Access-Control-Allow-Origin") != "https://claude.ai" ||
		!strings.Contains(pre.Header.Get("Access-Control-Allow-Headers"), "Mcp-Session-Id") ||
		!strings.Contains(pre.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("preflight from an allowed origin: status %d, headers %v", pre.StatusCode, pre.Header)
	}
	resp := tp.do("POST", mcpPath, init, map[string]string{"Origin": "https://claude.ai"})
	readMessages(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "https://claude.ai" ||
		!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), hdrSessionID) {
		t.Errorf("allowed origin: status %d, headers %v; want 200 exposing Mcp-Session-Id", resp.StatusCode, resp.Header)
	}
	// Origins compare case-insensitively, as browsers send them lowercase anyway.
	resp = tp.do("GET", "/health", "", map[string]string{"Origin": "HTTP://LOCALHOST:6274"})
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("allowed origin in upper case: status %d", resp.StatusCode)
	}
}

func TestProtocolVersionHeader(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	legacy := `{"jsonrpc":"2.0","id":1,"method":"echo"}`
	for _, c := range []struct {
		version, body string
		status, code  int // code: the JSON-RPC error, 0 for a result
	}{
		{"2024-11-05", legacy, 200, 0},
		{"2025-03-26", legacy, 200, 0},
		{"2025-06-18", legacy, 200, 0},
		{"2025-11-25", legacy, 200, 0},
		// 2026-07-28 has no sessions: its requests carry _meta instead.
		{modernProtocolVersion, modernBody(1, "echo", "c", nil), 200, 0},
		{modernProtocolVersion, legacy, 400, codeHeaderMismatch},
		{"1999-01-01", legacy, 400, codeUnsupportedVersion},
		{"latest", legacy, 400, codeUnsupportedVersion},
		{"2026-12-31", modernBody(1, "echo", "c", nil), 400, codeUnsupportedVersion},
	} {
		resp := tp.do("POST", mcpPath, c.body, map[string]string{hdrSessionID: sid, hdrProtocolVersion: c.version, hdrMethod: "echo"})
		msgs := readMessages(t, resp)
		if resp.StatusCode != c.status || len(msgs) != 1 {
			t.Errorf("%s %s: status %d (%s), want %d", hdrProtocolVersion, c.version, resp.StatusCode, msgs, c.status)
			continue
		}
		m := decode(t, msgs[0])
		switch {
		case c.code == 0 && m.Result == nil:
			t.Errorf("%s %s: %s, want a result", hdrProtocolVersion, c.version, msgs[0])
		case c.code != 0 && (m.Error == nil || m.Error.Code != c.code):
			t.Errorf("%s %s: %s, want a JSON-RPC error %d", hdrProtocolVersion, c.version, msgs[0], c.code)
		case c.code == codeUnsupportedVersion && (!strings.Contains(m.Error.Message, modernProtocolVersion) ||
			!strings.Contains(m.Error.Message, "2024-11-05 to 2025-11-25") || !strings.Contains(string(msgs[0]), `"supported":["2026-07-28","2025-11-25"`)):
			t.Errorf("%s %s: %s, want the supported revisions named", hdrProtocolVersion, c.version, msgs[0])
		}
	}
}

func TestSessionHeaderRules(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	if resp, _ := tp.post(mcpPath, "", `{"jsonrpc":"2.0","id":1,"method":"echo"}`); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("request without session: status %d, want 400", resp.StatusCode)
	}
	if resp, _ := tp.post(mcpPath, "0123", `{"jsonrpc":"2.0","id":1,"method":"echo"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown session: status %d, want 404", resp.StatusCode)
	}
	sid := tp.initialize(mcpPath)
	if resp, _ := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("initialize with a session id: status %d, want 400", resp.StatusCode)
	}
	if resp, _ := tp.post(mcpPath, "", `[{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}]`); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("initialize in a batch: status %d, want 400", resp.StatusCode)
	}
	for _, m := range []string{"GET", "DELETE"} {
		resp := tp.do(m, mcpPath, "", map[string]string{"Accept": "text/event-stream"})
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s without session: status %d, want 400", m, resp.StatusCode)
		}
	}
	resp := tp.do("PUT", mcpPath, "", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") == "" {
		t.Errorf("PUT: status %d, Allow %q; want 405 with Allow", resp.StatusCode, resp.Header.Get("Allow"))
	}
	resp = tp.do("POST", mcpPath, `{"jsonrpc":"2.0","id":1,"method":"echo"}`, map[string]string{hdrSessionID: sid, "Accept": "text/html"})
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotAcceptable {
		t.Errorf("Accept text/html: status %d, want 406", resp.StatusCode)
	}
	// A request id still in flight cannot be reused.
	go tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":"dup","method":"sleep","params":{"ms":300}}`)
	waitPending(t, tp, sid, 1)
	if resp, _ := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":"dup","method":"echo"}`); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("reused in-flight id: status %d, want 400", resp.StatusCode)
	}
}

func TestDeleteEndsSessionAndServer(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	_, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":1,"method":"spawn"}`)
	var spawned struct{ Pid int }
	json.Unmarshal(decode(t, msgs[0]).Result, &spawned)
	_, msgs = tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":2,"method":"echo"}`)
	var echo struct{ Pid int }
	json.Unmarshal(decode(t, msgs[0]).Result, &echo)
	if spawned.Pid == 0 || echo.Pid == 0 {
		t.Fatalf("spawn %+v, echo %+v", spawned, echo)
	}
	if st, ok := procStat(spawned.Pid); !ok || st.pgid != echo.Pid {
		t.Fatalf("grandchild %d: %+v, want it in the server's process group %d", spawned.Pid, st, echo.Pid)
	}
	resp := tp.do("DELETE", mcpPath, "", map[string]string{hdrSessionID: sid})
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: status %d, want 204", resp.StatusCode)
	}
	if resp, _ := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":3,"method":"echo"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("request after DELETE: status %d, want 404", resp.StatusCode)
	}
	waitGone(t, echo.Pid)
	waitGone(t, spawned.Pid) // the grandchild went with its process group
}

func TestStubbornServerIsKilled(t *testing.T) {
	// This server ignores stdin EOF and SIGTERM; only SIGKILL ends it.
	tp := startProxy(t, []Server{testServerCmd(t, "t", "stubborn")}, func(o *Options) { o.StopGrace = 200 * time.Millisecond })
	sid := tp.initialize(mcpPath)
	_, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":1,"method":"echo"}`)
	var echo struct{ Pid int }
	if len(msgs) != 1 {
		t.Fatalf("echo: %d messages, want 1: %s", len(msgs), msgs)
	}
	if err := json.Unmarshal(decode(t, msgs[0]).Result, &echo); err != nil || echo.Pid <= 0 {
		t.Fatalf("echo's result names no server pid (pid %d, %v): %s", echo.Pid, err, msgs[0])
	}
	resp := tp.do("DELETE", mcpPath, "", map[string]string{hdrSessionID: sid})
	resp.Body.Close()
	waitGone(t, echo.Pid)
}

func TestMaxSessions(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, func(o *Options) { o.MaxSessions = 2 })
	sid := tp.initialize(mcpPath)
	tp.initialize(mcpPath)
	resp, msgs := tp.post(mcpPath, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`)
	if resp.StatusCode != http.StatusServiceUnavailable || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "too many MCP sessions open (2)") {
		t.Fatalf("third session: status %d, body %s; want 503 saying why", resp.StatusCode, msgs)
	}
	if m := decode(t, msgs[0]); string(m.ID) != "0" {
		t.Errorf("the refusal answers id %s, want the initialize request's id 0", m.ID)
	}
	resp = tp.do("GET", "/servers/t/sse", "", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("SSE session beyond the cap: status %d, want 503", resp.StatusCode)
	}
	// Ending one makes room.
	tp.do("DELETE", mcpPath, "", map[string]string{hdrSessionID: sid}).Body.Close()
	tp.initialize(mcpPath)
}

func TestIdleSessionsExpire(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, func(o *Options) { o.SessionIdleTimeout = time.Hour })
	var mu sync.Mutex
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	tp.p.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	idle := tp.initialize(mcpPath)
	streaming := tp.initialize(mcpPath)
	get := tp.do("GET", mcpPath, "", map[string]string{hdrSessionID: streaming, "Accept": "text/event-stream"})
	defer get.Body.Close()
	waitActive(t, tp, streaming)

	advance(59 * time.Minute)
	tp.p.expireIdle()
	if resp, _ := tp.post(mcpPath, idle, `{"jsonrpc":"2.0","id":1,"method":"echo"}`); resp.StatusCode != 200 {
		t.Fatalf("session idle for 59m: status %d, want it alive", resp.StatusCode)
	}
	advance(61 * time.Minute)
	tp.p.expireIdle()
	if resp, _ := tp.post(mcpPath, idle, `{"jsonrpc":"2.0","id":1,"method":"echo"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("session idle for 61m: status %d, want 404", resp.StatusCode)
	}
	if resp, _ := tp.post(mcpPath, streaming, `{"jsonrpc":"2.0","id":1,"method":"echo"}`); resp.StatusCode != 200 {
		t.Errorf("session with an open stream: status %d, want it kept", resp.StatusCode)
	}
}

func waitActive(t *testing.T, tp *testProxy, sid string) {
	t.Helper()
	tp.p.mu.Lock()
	s := tp.p.sessions[sid]
	tp.p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tu.Poll(ctx, "the session to become active", func() bool { _, idle := s.idleSince(); return !idle }); err != nil {
		t.Fatal(err)
	}
}

func TestShutdownWithOpenSessionsAndStreams(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1"), testServerCmd(t, "stubborn", "stubborn")}, func(o *Options) { o.StopGrace = 300 * time.Millisecond })
	const path = "/servers/t/mcp"
	sid := tp.initialize(path)
	get := tp.do("GET", path, "", map[string]string{hdrSessionID: sid, "Accept": "text/event-stream"})
	defer get.Body.Close()
	getEvents := sseEvents(get.Body)
	legacy := tp.do("GET", "/servers/t/sse", "", map[string]string{"Accept": "text/event-stream"})
	defer legacy.Body.Close()
	legacyEvents := sseEvents(legacy.Body)
	nextEvent(t, legacyEvents) // endpoint
	tp.initialize("/servers/stubborn/mcp")

	inflight := make(chan []json.RawMessage, 1)
	go func() {
		_, msgs := tp.post(path, sid, `{"jsonrpc":"2.0","id":"long","method":"sleep","params":{"ms":600000}}`)
		inflight <- msgs
	}()
	waitPending(t, tp, sid, 1)
	if n := len(childPids(t)); n != 3 {
		t.Fatalf("%d servers running, want 3", n)
	}

	if err := tp.stop(); err != nil {
		t.Errorf("Serve returned %v", err)
	}
	msgs := <-inflight
	if len(msgs) != 1 || decode(t, msgs[0]).Error == nil || !strings.Contains(decode(t, msgs[0]).Error.Message, "shutting down") {
		t.Errorf("in-flight request got %s, want an error saying the proxy is shutting down", msgs)
	}
	if _, ok := nextEvent(t, getEvents); ok {
		t.Error("GET stream still open after shutdown")
	}
	if _, ok := nextEvent(t, legacyEvents); ok {
		t.Error("legacy SSE stream still open after shutdown")
	}
	if pids := childPids(t); len(pids) != 0 {
		t.Errorf("servers left after Serve returned: %v", pids)
	}
}

func TestRunListensAndStops(t *testing.T) {
	goroutines := runtime.NumGoroutine()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	err = Run(context.Background(), Options{Token: testToken, Addr: busy.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), "listening for MCP clients") || !strings.Contains(err.Error(), "hint:") {
		t.Errorf("Run on a busy address: %v, want a listen error with a hint", err)
	}
	if err := Run(context.Background(), Options{Addr: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "token is empty") {
		t.Errorf("Run without a token: %v", err)
	}

	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Token: testToken, Addr: addr, Config: Config{Servers: []Server{testServerCmd(t, "t", "1")}}})
	}()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := tu.Poll(wctx, "/health to answer 200", func() bool {
		resp, err := client.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}); err != nil {
		t.Fatalf("Run never answered /health on %s: %v", addr, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	checkNoLeaks(t, goroutines)
}

func TestChildCrashOnLegacySSE(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	resp := tp.do("GET", "/servers/t/sse", "", map[string]string{"Accept": "text/event-stream"})
	defer resp.Body.Close()
	events := sseEvents(resp.Body)
	ev, _ := nextEvent(t, events)
	endpoint := ev.data
	tp.post(endpoint, "", `{"jsonrpc":"2.0","id":"s","method":"sleep","params":{"ms":600000}}`)
	tp.post(endpoint, "", `{"jsonrpc":"2.0","id":"c","method":"crash"}`)
	got := map[string]string{}
	for range 2 {
		ev, ok := nextEvent(t, events)
		if !ok {
			t.Fatalf("stream ended early; got %v", got)
		}
		m := decode(t, []byte(ev.data))
		if m.Error == nil {
			t.Fatalf("got %s, want error responses", ev.data)
		}
		got[string(m.ID)] = m.Error.Message
	}
	for _, id := range []string{`"s"`, `"c"`} {
		if !strings.Contains(got[id], "exited (exit status 3)") {
			t.Errorf("request %s got %q, want the exit named", id, got[id])
		}
	}
	if _, ok := nextEvent(t, events); ok {
		t.Error("the SSE stream stayed open after the server died")
	}
}
