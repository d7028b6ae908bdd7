package mcpproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// modernBody is a 2026-07-28 request: params with the per-request _meta.
func modernBody(id int, method, client string, params map[string]any) string {
	if params == nil {
		params = map[string]any{}
	}
	params["_meta"] = map[string]any{
		metaVersion:                                  modernProtocolVersion,
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": client, "version": "1"},
		"io.modelcontextprotocol/clientCapabilities": map[string]any{},
	}
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// modernPost sends a 2026-07-28 request with the headers that mirror it
// (overridden by hdr) and returns the messages answered.
func (tp *testProxy) modernPost(body string, hdr map[string]string) (*http.Response, []json.RawMessage) {
	tp.t.Helper()
	var m struct {
		Method string `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	_ = json.Unmarshal([]byte(body), &m)
	h := map[string]string{hdrProtocolVersion: modernProtocolVersion, hdrMethod: m.Method, hdrName: m.Params.Name}
	for k, v := range hdr {
		h[k] = v
	}
	resp := tp.do("POST", mcpPath, body, h)
	return resp, readMessages(tp.t, resp)
}

// modernResultOf checks a 2026-07-28 answer and returns its result.
func modernResultOf(t testing.TB) func(*http.Response, []json.RawMessage) map[string]any {
	return func(resp *http.Response, msgs []json.RawMessage) map[string]any {
		t.Helper()
		return checkModernResult(t, resp, msgs)
	}
}

func checkModernResult(t testing.TB, resp *http.Response, msgs []json.RawMessage) map[string]any {
	t.Helper()
	if resp.StatusCode != 200 || len(msgs) != 1 {
		t.Fatalf("status %d, messages %s; want 200 and one response", resp.StatusCode, msgs)
	}
	if sid := resp.Header.Get(hdrSessionID); sid != "" {
		t.Errorf("a 2026-07-28 answer carries %s %q", hdrSessionID, sid)
	}
	var r struct {
		Result map[string]any `json:"result"`
	}
	if err := json.Unmarshal(msgs[0], &r); err != nil || r.Result == nil {
		t.Fatalf("answer %s is not a result (%v)", msgs[0], err)
	}
	if r.Result["resultType"] != "complete" {
		t.Errorf("result %v has no resultType \"complete\"", r.Result)
	}
	return r.Result
}

func echoPid(t *testing.T, tp *testProxy, client string) float64 {
	t.Helper()
	res := modernResultOf(t)(tp.modernPost(modernBody(1, "echo", client, nil), nil))
	return res["pid"].(float64)
}

func TestModernRequestsUsePooledServers(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	pid := echoPid(t, tp, "client-a")
	if again := echoPid(t, tp, "client-a"); again != pid {
		t.Errorf("the second request of the same client ran on server %v, want the pooled %v", again, pid)
	}
	if other := echoPid(t, tp, "client-b"); other == pid {
		t.Errorf("another client's request ran on client-a's server %v", pid)
	}
	// The proxy initialized the server on the client's behalf.
	res := modernResultOf(t)(tp.modernPost(modernBody(2, "received", "client-a", nil), nil))
	if got := fmt.Sprint(res["received"]); got != "[notifications/initialized]" {
		t.Errorf("the server received %s, want [notifications/initialized]", got)
	}
	res = modernResultOf(t)(tp.modernPost(modernBody(3, "server/discover", "client-a", nil), nil))
	versions := fmt.Sprint(res["supportedVersions"])
	meta, _ := res["_meta"].(map[string]any)
	info, _ := meta[metaServerInfo].(map[string]any)
	if !strings.Contains(versions, modernProtocolVersion) || !strings.Contains(versions, "2025-11-25") ||
		res["capabilities"] == nil || info["name"] != "testserver" || res["cacheScope"] != "private" {
		t.Errorf("server/discover answered %v", res)
	}
	if n := pooled(tp); n != 2 {
		t.Errorf("%d pooled servers, want 2 (one per client)", n)
	}
}

func TestModernConcurrentRequestsGetTheirOwnServers(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			modernResultOf(t)(tp.modernPost(modernBody(1, "sleep", "c", map[string]any{"ms": 300 + i}), nil))
		})
	}
	wg.Wait()
	if n := pooled(tp); n != 3 {
		t.Errorf("%d pooled servers after 3 concurrent requests, want 3", n)
	}
}

func TestModernServerRequestIsRefused(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	// The server asks the client to sample; the proxy answers it with an
	// error at once, and the server then answers the tool call.
	res := modernResultOf(t)(tp.modernPost(modernBody(1, "ask", "c", nil), nil))
	if res["answer"] != nil {
		t.Errorf("ask answered %v, want the refused sampling request (no result)", res)
	}
}

func TestModernClientGoneEndsItsServer(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "POST", tp.base+mcpPath, strings.NewReader(modernBody(1, "sleep", "c", map[string]any{"ms": 60000})))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"Authorization": "Bearer " + testToken, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", hdrProtocolVersion: modernProtocolVersion, hdrMethod: "sleep"} {
		req.Header.Set(k, v)
	}
	// The client goes away once the proxy runs a server for its request.
	go func() {
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		defer pcancel()
		_ = tu.Poll(pctx, "a server for the request", func() bool { return len(tp.p.sessionCounts()) > 0 })
		cancel()
	}()
	if resp, err := tp.client.Do(req); err == nil {
		resp.Body.Close()
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := tu.Poll(wctx, "the server to be gone", func() bool { return len(tp.p.sessionCounts()) == 0 }); err != nil {
		t.Errorf("%v: the server of a request whose client went away is still there: %v", err, tp.p.sessionCounts())
	}
}

func TestModernPoolMakesRoomAtTheCap(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, func(o *Options) { o.MaxSessions = 1 })
	a := echoPid(t, tp, "client-a")
	if b := echoPid(t, tp, "client-b"); b == a {
		t.Errorf("client-b got client-a's server")
	}
	waitGone(t, int(a))
}

func TestModernServerThatCannotStart(t *testing.T) {
	tp := startProxy(t, []Server{{Name: "t", Command: "false"}}, nil)
	resp, msgs := tp.modernPost(modernBody(1, "tools/list", "c", nil), nil)
	if resp.StatusCode != http.StatusBadGateway || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `initializing MCP server \"t\"`) {
		t.Errorf("status %d, body %s; want 502 saying the initialize failed", resp.StatusCode, msgs)
	}
}

func TestModernRequestsRefused(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1"), testServerCmd(t, "u", "1")}, nil)
	call := modernBody(1, "tools/call", "c", map[string]any{"name": "echo"})
	cases := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status, code             int
	}{
		{"_meta names another version", "POST", mcpPath, strings.Replace(modernBody(1, "echo", "c", nil), `"`+modernProtocolVersion+`"`, `"2025-11-25"`, 1), map[string]string{hdrMethod: "echo"}, 400, codeHeaderMismatch},
		{"no _meta", "POST", mcpPath, `{"jsonrpc":"2.0","id":1,"method":"echo"}`, map[string]string{hdrMethod: "echo"}, 400, codeHeaderMismatch},
		{"Mcp-Method missing", "POST", mcpPath, modernBody(1, "echo", "c", nil), map[string]string{hdrMethod: ""}, 400, codeHeaderMismatch},
		{"Mcp-Method differs", "POST", mcpPath, modernBody(1, "echo", "c", nil), map[string]string{hdrMethod: "tools/list"}, 400, codeHeaderMismatch},
		{"Mcp-Name missing", "POST", mcpPath, call, map[string]string{hdrName: ""}, 400, codeHeaderMismatch},
		{"Mcp-Name differs", "POST", mcpPath, call, map[string]string{hdrName: "other"}, 400, codeHeaderMismatch},
		{"Mcp-Name bad base64", "POST", mcpPath, call, map[string]string{hdrName: "=?base64?***?="}, 400, codeHeaderMismatch},
		{"batch", "POST", mcpPath, "[" + modernBody(1, "echo", "c", nil) + "]", nil, 400, codeInvalidRequest},
		{"a response", "POST", mcpPath, `{"jsonrpc":"2.0","id":1,"result":{}}`, nil, 400, codeInvalidRequest},
		{"initialize", "POST", mcpPath, modernBody(1, "initialize", "c", nil), map[string]string{hdrMethod: "initialize"}, 400, codeInvalidRequest},
		{"GET", "GET", mcpPath, "", nil, 405, codeConnectionClosed},
		{"DELETE", "DELETE", mcpPath, "", nil, 405, codeConnectionClosed},
		{"HTTP+SSE endpoint", "GET", "/servers/t/sse", "", nil, 400, codeInvalidRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := map[string]string{hdrProtocolVersion: modernProtocolVersion, hdrMethod: "tools/call", hdrName: "echo"}
			for k, v := range c.hdr {
				h[k] = v
			}
			resp := tp.do(c.method, c.path, c.body, h)
			msgs := readMessages(t, resp)
			if resp.StatusCode != c.status || len(msgs) != 1 {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, msgs, c.status)
			}
			if m := decode(t, msgs[0]); m.Error == nil || m.Error.Code != c.code {
				t.Errorf("body %s, want a JSON-RPC error %d", msgs[0], c.code)
			}
		})
	}
	// A notification relates to no request: accepted, and sent nowhere.
	resp := tp.do("POST", mcpPath, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`, map[string]string{hdrProtocolVersion: modernProtocolVersion})
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Errorf("notification: status %d, want 202", resp.StatusCode)
	}
	if n := len(childPids(t)); n != 0 {
		t.Errorf("refused requests started %d servers", n)
	}
	// The control case: the same request with headers that agree reaches the
	// server (which knows no tools/call and says so).
	if resp, msgs := tp.modernPost(call, nil); resp.StatusCode != 200 || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "method not found: tools/call") {
		t.Errorf("tools/call with matching headers: status %d, body %s", resp.StatusCode, msgs)
	}
}
