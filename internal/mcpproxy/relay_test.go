package mcpproxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
)

const mcpPath = "/servers/t/mcp"

func TestRelayPreservesIDs(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	for _, id := range []string{`7`, `"abc"`, `"ü-\u00e9"`, `9007199254740993`, `-1`} {
		resp, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":`+id+`,"method":"echo","params":{"x":[1,2]}}`)
		if resp.StatusCode != 200 || len(msgs) != 1 {
			t.Fatalf("id %s: status %d, messages %s", id, resp.StatusCode, msgs)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("id %s: Content-Type %q, want application/json for a lone response", id, ct)
		}
		m := decode(t, msgs[0])
		if string(m.ID) != id {
			t.Errorf("got id %s, want %s exactly", m.ID, id)
		}
		if !strings.Contains(string(m.Result), `"params":{"x":[1,2]}`) {
			t.Errorf("params not relayed as sent: %s", m.Result)
		}
	}
}

func TestRelayPrettyPrintedRequestReachesServerOnOneLine(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	resp, msgs := tp.post(mcpPath, sid, "{\n  \"jsonrpc\": \"2.0\",\n  \"id\": 1,\n  \"method\": \"echo\",\n  \"params\": {\"s\": \"a\\nb\"}\n}\n")
	if resp.StatusCode != 200 || len(msgs) != 1 {
		t.Fatalf("status %d, messages %s", resp.StatusCode, msgs)
	}
	if m := decode(t, msgs[0]); !strings.Contains(string(m.Result), `"s":"a\nb"`) {
		t.Errorf("result %s, want the params back intact", m.Result)
	}
}

func TestRelayNotificationsBothWays(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)

	// Client to server: the server records what it received.
	resp, _ := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notification: status %d, want 202", resp.StatusCode)
	}
	_, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":2,"method":"received"}`)
	var got struct{ Received []string }
	if err := json.Unmarshal(decode(t, msgs[0]).Result, &got); err != nil {
		t.Fatal(err)
	}
	want := []string{"notifications/initialized", "notifications/roots/list_changed"}
	if !slices.Equal(got.Received, want) {
		t.Errorf("server received %q, want %q", got.Received, want)
	}

	// Server to client: the notifications come first on the request's SSE
	// stream, progress included, then the response.
	resp, msgs = tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":3,"method":"notify","params":{"text":"hello","_meta":{"progressToken":"p1"}}}`)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q, want text/event-stream when notifications precede the response", ct)
	}
	if len(msgs) != 3 {
		t.Fatalf("got %d messages, want progress, message, response: %s", len(msgs), msgs)
	}
	if m := decode(t, msgs[0]); m.Method != "notifications/progress" || !strings.Contains(string(m.Params), `"progressToken":"p1"`) {
		t.Errorf("first message %s, want the progress notification", msgs[0])
	}
	if m := decode(t, msgs[1]); m.Method != "notifications/message" || !strings.Contains(string(m.Params), "hello") {
		t.Errorf("second message %s, want notifications/message", msgs[1])
	}
	if m := decode(t, msgs[2]); string(m.ID) != "3" || m.Result == nil {
		t.Errorf("last message %s, want the response to id 3", msgs[2])
	}
}

func TestRelayServerRequestAndClientResponse(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)

	resp := tp.do("POST", mcpPath, `{"jsonrpc":"2.0","id":"q1","method":"ask"}`, map[string]string{hdrSessionID: sid})
	defer resp.Body.Close()
	events := sseEvents(resp.Body)
	ev, ok := nextEvent(t, events)
	if !ok {
		t.Fatal("stream ended before the server's request")
	}
	req := decode(t, []byte(ev.data))
	if req.Method != "sampling/createMessage" || string(req.ID) != `"srv-1"` {
		t.Fatalf("got %s, want the server's sampling/createMessage request", ev.data)
	}
	// The client answers on a new POST, which gets 202.
	answer := `{"jsonrpc":"2.0","id":"srv-1","result":{"role":"assistant","content":{"type":"text","text":"42"},"model":"m"}}`
	if r2, _ := tp.post(mcpPath, sid, answer); r2.StatusCode != http.StatusAccepted {
		t.Fatalf("client response: status %d, want 202", r2.StatusCode)
	}
	ev, ok = nextEvent(t, events)
	if !ok {
		t.Fatal("stream ended before the final response")
	}
	final := decode(t, []byte(ev.data))
	if string(final.ID) != `"q1"` || !strings.Contains(string(final.Result), `"text":"42"`) {
		t.Errorf("final response %s, want id q1 carrying the client's answer", ev.data)
	}
	if _, ok := nextEvent(t, events); ok {
		t.Error("stream did not end after the response")
	}
}

func TestServerRequestForJSONOnlyPostTravelsOnGETStream(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	get := tp.do("GET", mcpPath, "", map[string]string{hdrSessionID: sid, "Accept": "text/event-stream"})
	defer get.Body.Close()
	if get.StatusCode != 200 {
		t.Fatalf("GET: status %d", get.StatusCode)
	}
	stream := sseEvents(get.Body)

	// A second GET stream for the same session is refused.
	if r := tp.do("GET", mcpPath, "", map[string]string{hdrSessionID: sid, "Accept": "text/event-stream"}); r.StatusCode != http.StatusConflict {
		t.Errorf("second GET: status %d, want 409", r.StatusCode)
		r.Body.Close()
	} else {
		r.Body.Close()
	}

	type result struct {
		resp *http.Response
		msgs []json.RawMessage
	}
	done := make(chan result, 1)
	go func() {
		resp := tp.do("POST", mcpPath, `{"jsonrpc":"2.0","id":5,"method":"ask"}`, map[string]string{hdrSessionID: sid, "Accept": "application/json"})
		done <- result{resp, readMessages(t, resp)}
	}()
	ev, ok := nextEvent(t, stream)
	if !ok || decode(t, []byte(ev.data)).Method != "sampling/createMessage" {
		t.Fatalf("GET stream got %+v, want the server's request", ev)
	}
	tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":"srv-1","result":{"ok":1}}`)
	r := <-done
	if ct := r.resp.Header.Get("Content-Type"); ct != "application/json" || len(r.msgs) != 1 {
		t.Fatalf("POST answered %q with %s, want one JSON response", ct, r.msgs)
	}
	if m := decode(t, r.msgs[0]); string(m.ID) != "5" || !strings.Contains(string(m.Result), `"ok":1`) {
		t.Errorf("response %s, want id 5 with the client's answer", r.msgs[0])
	}
}

func TestBatch(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	body := `[{"jsonrpc":"2.0","id":1,"method":"echo","params":{"n":1}},{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":2,"method":"echo","params":{"n":2}}]`
	resp, msgs := tp.post(mcpPath, sid, body)
	if resp.StatusCode != 200 || len(msgs) != 2 {
		t.Fatalf("status %d, messages %s; want two responses", resp.StatusCode, msgs)
	}
	ids := []string{string(decode(t, msgs[0]).ID), string(decode(t, msgs[1]).ID)}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"1", "2"}) {
		t.Errorf("response ids %v, want 1 and 2", ids)
	}
	// Two requests with one id in a batch are refused before reaching the server.
	resp, _ = tp.post(mcpPath, sid, `[{"jsonrpc":"2.0","id":1,"method":"echo"},{"jsonrpc":"2.0","id":1,"method":"echo"}]`)
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("duplicate ids in a batch: status %d, want 400", resp.StatusCode)
	}
}

func TestConcurrentSessionsAreIsolated(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	const n = 6
	var wg sync.WaitGroup
	pids := make([]int, n)
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sid := tp.initialize(mcpPath)
			tag := fmt.Sprintf("notifications/client-%d", i)
			tp.post(mcpPath, sid, `{"jsonrpc":"2.0","method":"`+tag+`"}`)
			// Concurrent requests on one session, answered out of order.
			var inner sync.WaitGroup
			for j, ms := range []int{150, 10} {
				inner.Add(1)
				go func() {
					defer inner.Done()
					_, msgs := tp.post(mcpPath, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"sleep","params":{"ms":%d}}`, j, ms))
					if len(msgs) != 1 || string(decode(t, msgs[0]).ID) != fmt.Sprint(j) {
						errs <- fmt.Errorf("session %d request %d: got %s", i, j, msgs)
					}
				}()
			}
			inner.Wait()
			_, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":9,"method":"echo"}`)
			var echo struct{ Pid int }
			json.Unmarshal(decode(t, msgs[0]).Result, &echo)
			pids[i] = echo.Pid
			_, msgs = tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":10,"method":"received"}`)
			var rec struct{ Received []string }
			json.Unmarshal(decode(t, msgs[0]).Result, &rec)
			if want := []string{"notifications/initialized", tag}; !slices.Equal(rec.Received, want) {
				errs <- fmt.Errorf("session %d's server received %q, want only its own %q", i, rec.Received, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	seen := map[int]bool{}
	for i, pid := range pids {
		if pid == 0 || seen[pid] {
			t.Errorf("session %d: server pid %d, want a process of its own (all: %v)", i, pid, pids)
		}
		seen[pid] = true
	}
}

func TestGarbageFromServerIsSkipped(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	_, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":1,"method":"garbage"}`)
	if len(msgs) != 1 || decode(t, msgs[0]).Result == nil {
		t.Fatalf("got %s, want the response after the garbage line", msgs)
	}
}

func TestLegacySSETransport(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	resp := tp.do("GET", "/servers/t/sse", "", map[string]string{"Accept": "text/event-stream"})
	if resp.StatusCode != 200 {
		t.Fatalf("GET sse: status %d", resp.StatusCode)
	}
	events := sseEvents(resp.Body)
	ev, ok := nextEvent(t, events)
	if !ok || ev.name != "endpoint" || !strings.HasPrefix(ev.data, "/servers/t/messages?sessionId=") {
		t.Fatalf("first event %+v, want the endpoint event", ev)
	}
	endpoint := ev.data
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":"e1","method":"ask"}`,
	} {
		if r, _ := tp.post(endpoint, "", body); r.StatusCode != http.StatusAccepted {
			t.Fatalf("POST %s: status %d, want 202", body, r.StatusCode)
		}
	}
	want := []func(rpc) bool{
		func(m rpc) bool { return string(m.ID) == "0" && m.Result != nil },
		func(m rpc) bool { return m.Method == "sampling/createMessage" },
	}
	for i, ok := range want {
		ev, _ := nextEvent(t, events)
		if ev.name != "message" || !ok(decode(t, []byte(ev.data))) {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	tp.post(endpoint, "", `{"jsonrpc":"2.0","id":"srv-1","result":{"a":1}}`)
	ev, _ = nextEvent(t, events)
	if m := decode(t, []byte(ev.data)); string(m.ID) != `"e1"` || !strings.Contains(string(m.Result), `"a":1`) {
		t.Fatalf("got %s, want the answer to e1", ev.data)
	}
	if r, _ := tp.post("/servers/t/messages?sessionId=nope", "", `{"jsonrpc":"2.0","method":"x"}`); r.StatusCode != http.StatusNotFound {
		t.Errorf("unknown sessionId: status %d, want 404", r.StatusCode)
	}
	// Closing the stream ends the session and stops its server.
	tp.post(endpoint, "", `{"jsonrpc":"2.0","id":"pid","method":"echo"}`)
	ev, _ = nextEvent(t, events)
	var res struct{ Pid int }
	json.Unmarshal(decode(t, []byte(ev.data)).Result, &res)
	resp.Body.Close()
	waitGone(t, res.Pid)
	if r, _ := tp.post(endpoint, "", `{"jsonrpc":"2.0","method":"x"}`); r.StatusCode != http.StatusNotFound {
		t.Errorf("POST after the stream closed: status %d, want 404", r.StatusCode)
	}
}

func TestShortcutsWithOneServer(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "only", "1")}, nil)
	sid := tp.initialize("/mcp")
	if _, msgs := tp.post("/mcp", sid, `{"jsonrpc":"2.0","id":1,"method":"echo"}`); len(msgs) != 1 {
		t.Fatalf("/mcp echo: %s", msgs)
	}
	// The session belongs to the server: the long path reaches it too.
	if _, msgs := tp.post("/servers/only/mcp", sid, `{"jsonrpc":"2.0","id":2,"method":"echo"}`); len(msgs) != 1 {
		t.Fatalf("/servers/only/mcp echo: %s", msgs)
	}
	resp := tp.do("GET", "/sse", "", map[string]string{"Accept": "text/event-stream"})
	defer resp.Body.Close()
	ev, _ := nextEvent(t, sseEvents(resp.Body))
	if ev.name != "endpoint" || !strings.HasPrefix(ev.data, "/messages?sessionId=") {
		t.Errorf("/sse endpoint event %+v, want /messages?sessionId=...", ev)
	}
}

func TestShortcutsNeedANameWithTwoServers(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "a", "1"), testServerCmd(t, "b", "1")}, nil)
	resp, msgs := tp.post("/mcp", "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(msgs[0]), "servers: a, b") {
		t.Errorf("/mcp with two servers: status %d, body %s; want 404 naming the servers", resp.StatusCode, msgs)
	}
	sidB := tp.initialize("/servers/b/mcp")
	// A session of b is not a session of a.
	if resp, _ := tp.post("/servers/a/mcp", sidB, `{"jsonrpc":"2.0","id":1,"method":"echo"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("b's session on a: status %d, want 404", resp.StatusCode)
	}
	if resp, _ := tp.post("/servers/c/mcp", "", `{"jsonrpc":"2.0","id":1,"method":"initialize"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown server: status %d, want 404", resp.StatusCode)
	}
}

func TestCancelledRequestIsSettled(t *testing.T) {
	tp := startProxy(t, []Server{testServerCmd(t, "t", "1")}, nil)
	sid := tp.initialize(mcpPath)
	done := make(chan []json.RawMessage, 1)
	go func() {
		_, msgs := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":"c1","method":"sleep","params":{"ms":600000}}`)
		done <- msgs
	}()
	waitPending(t, tp, sid, 1)
	if resp, _ := tp.post(mcpPath, sid, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"c1","reason":"user pressed Esc"}}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("cancel: status %d", resp.StatusCode)
	}
	msgs := <-done
	if len(msgs) != 1 {
		t.Fatalf("cancelled request got %s", msgs)
	}
	if m := decode(t, msgs[0]); string(m.ID) != `"c1"` || m.Error == nil || m.Error.Code != codeRequestCancelled {
		t.Errorf("cancelled request got %s, want a cancellation error for c1", msgs[0])
	}
	// The server was told, and the id is free again.
	_, msgs = tp.post(mcpPath, sid, `{"jsonrpc":"2.0","id":"c1","method":"received"}`)
	if !strings.Contains(string(decode(t, msgs[0]).Result), "notifications/cancelled") {
		t.Errorf("server received %s, want the cancellation relayed", msgs[0])
	}
}
