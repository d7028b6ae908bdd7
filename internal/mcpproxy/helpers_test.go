package mcpproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

const testToken = "test-token-0123456789abcdef"

// testServerCmd is a Server running this test binary as the test MCP server.
func testServerCmd(t testing.TB, name, mode string) Server {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Server{Name: name, Command: exe, Env: map[string]string{testServerEnv: mode}}
}

// testProxy is a Proxy serving on 127.0.0.1:0 for one test.
type testProxy struct {
	t      testing.TB
	p      *Proxy
	base   string
	cancel context.CancelFunc
	done   chan error
	client *http.Client
}

// startProxy serves servers until the test ends, then shuts down and checks
// that no goroutine and no process was left behind.
func startProxy(t testing.TB, servers []Server, mutate func(*Options)) *testProxy {
	t.Helper()
	goroutines := runtime.NumGoroutine()
	opts := Options{
		Config:    Config{Servers: servers},
		Token:     testToken,
		Logger:    hclog.New(&hclog.LoggerOptions{Name: "mcp-proxy", Level: hclog.Debug, Output: testWriter{t}}),
		StopGrace: 400 * time.Millisecond,
	}
	if mutate != nil {
		mutate(&opts)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tp := &testProxy{
		t: t, p: p, base: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan error, 1),
		client: &http.Client{Transport: &http.Transport{}},
	}
	go func() { tp.done <- p.Serve(ctx, ln) }()
	t.Cleanup(func() {
		tp.stop()
		checkNoLeaks(t, goroutines)
	})
	return tp
}

// stop shuts the proxy down (idempotent) and returns Serve's error.
func (tp *testProxy) stop() error {
	tp.cancel()
	tp.client.CloseIdleConnections()
	select {
	case err, ok := <-tp.done:
		if ok {
			close(tp.done)
		}
		return err
	case <-time.After(60 * time.Second):
		tp.t.Fatal("Serve did not return after its context was cancelled")
		return nil
	}
}

// testWriter sends log output to t.Log, and drops it once the test is over.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	defer func() { _ = recover() }() // a late log line after the test ended
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// do sends one request with the token (unless hdr sets Authorization).
func (tp *testProxy) do(method, path, body string, hdr map[string]string) *http.Response {
	tp.t.Helper()
	req, err := http.NewRequest(method, tp.base+path, strings.NewReader(body))
	if err != nil {
		tp.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := tp.client.Do(req)
	if err != nil {
		tp.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// post sends a JSON-RPC body on a session and returns the messages answered,
// whether as JSON or as an SSE stream (read to its end).
func (tp *testProxy) post(path, sid, body string) (*http.Response, []json.RawMessage) {
	tp.t.Helper()
	hdr := map[string]string{}
	if sid != "" {
		hdr[hdrSessionID] = sid
	}
	resp := tp.do("POST", path, body, hdr)
	return resp, readMessages(tp.t, resp)
}

// initialize opens a Streamable HTTP session and returns its id.
func (tp *testProxy) initialize(path string) string {
	tp.t.Helper()
	resp, msgs := tp.post(path, "", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"go-test","version":"1"}}}`)
	if resp.StatusCode != 200 || len(msgs) != 1 {
		tp.t.Fatalf("initialize: status %d, messages %s", resp.StatusCode, msgs)
	}
	sid := resp.Header.Get(hdrSessionID)
	if sid == "" {
		tp.t.Fatal("initialize: no Mcp-Session-Id in the response")
	}
	resp, _ = tp.post(path, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if resp.StatusCode != http.StatusAccepted {
		tp.t.Fatalf("notifications/initialized: status %d, want 202", resp.StatusCode)
	}
	return sid
}

func readMessages(t testing.TB, resp *http.Response) []json.RawMessage {
	t.Helper()
	defer resp.Body.Close()
	ct := resp.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "text/event-stream"):
		var out []json.RawMessage
		for ev := range sseEvents(resp.Body) {
			if ev.name == "message" {
				out = append(out, json.RawMessage(ev.data))
			}
		}
		return out
	case strings.HasPrefix(ct, "application/json"):
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.TrimSpace(body)
		if len(body) > 0 && body[0] == '[' {
			var arr []json.RawMessage
			if err := json.Unmarshal(body, &arr); err != nil {
				t.Fatalf("bad JSON array %s: %v", body, err)
			}
			return arr
		}
		return []json.RawMessage{body}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

type sseEvent struct{ name, data string }

// sseEvents parses an SSE body until it ends.
func sseEvents(body io.Reader) <-chan sseEvent {
	ch := make(chan sseEvent, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 1<<20), 128<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.data != "" || ev.name != "" {
					if ev.name == "" {
						ev.name = "message"
					}
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data += strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return ch
}

// nextEvent waits for the next event of a stream; ok is false at its end.
func nextEvent(t testing.TB, ch <-chan sseEvent) (sseEvent, bool) {
	t.Helper()
	select {
	case ev, ok := <-ch:
		return ev, ok
	case <-time.After(30 * time.Second):
		t.Fatal("no SSE event within 30s")
		return sseEvent{}, false
	}
}

// rpc is a decoded JSON-RPC message for assertions.
type rpc struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decode(t testing.TB, raw []byte) rpc {
	t.Helper()
	var m rpc
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
	return m
}

// checkNoLeaks waits for the goroutine count to fall back to what it was
// before the test and checks that the test process has no child processes
// left (the proxy's servers are its children).
func checkNoLeaks(t testing.TB, before int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := tu.Poll(ctx, "the test's goroutines to end", func() bool { return runtime.NumGoroutine() <= before }); err != nil {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Errorf("goroutines leaked: %d now, %d before the test\n%s", runtime.NumGoroutine(), before, buf[:n])
	}
	if err := tu.Poll(ctx, "the child processes to end", func() bool { return len(childPids(t)) == 0 }); err != nil {
		t.Errorf("%v: child processes left behind: %v", err, childPids(t))
	}
}

// childPids lists the live (or unreaped) children of this process, from /proc.
func childPids(t testing.TB) []int {
	t.Helper()
	me := os.Getpid()
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		st, ok := procStat(pid)
		if ok && st.ppid == me {
			out = append(out, pid)
		}
	}
	return out
}

type procInfo struct {
	state byte
	ppid  int
	pgid  int
}

// procStat reads /proc/PID/stat; ok is false when the process is gone.
func procStat(pid int) (procInfo, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	// pid (comm) state ppid pgrp ...; comm may contain spaces and parens.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return procInfo{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgid, _ := strconv.Atoi(f[2])
	return procInfo{state: f[0][0], ppid: ppid, pgid: pgid}, true
}

// processGone reports whether pid has exited (a zombie awaiting a reaper
// that is not us counts as exited).
func processGone(pid int) bool {
	st, ok := procStat(pid)
	return !ok || (st.state == 'Z' && st.ppid != os.Getpid())
}

// waitGone fails the test if pid is still running after a generous wait.
func waitGone(t testing.TB, pid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tu.Poll(ctx, "process "+strconv.Itoa(pid)+" to end", func() bool { return processGone(pid) }); err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
