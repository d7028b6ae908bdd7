package mcpproxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The tests' own stdio MCP server: the test binary re-executed with
// MCPPROXY_TEST_SERVER set. It is a real process speaking newline-delimited
// JSON-RPC on stdin/stdout, small enough that each behaviour a test needs is
// one method:
//
//	initialize             answers with the client's protocol version
//	echo                   answers {"params": ..., "pid": its pid}
//	notify                 sends notifications/message (and progress, if asked) first
//	ask                    sends the client a sampling/createMessage request and
//	                       answers with the client's reply
//	received               answers with the notifications it has received
//	sleep {"ms"}           answers after a while (concurrently)
//	crash                  writes to stderr and exits 3 without answering
//	spawn                  starts a grandchild in its process group, answers its pid
//	big {"n"}              answers with an n-byte string
//	garbage                writes a non-JSON line to stdout, then answers
//
// MCPPROXY_TEST_SERVER=stubborn also ignores SIGTERM and stdin EOF.
const testServerEnv = "MCPPROXY_TEST_SERVER"

func TestMain(m *testing.M) {
	switch os.Getenv(testServerEnv) {
	case "":
		os.Exit(m.Run())
	case "sleeper":
		time.Sleep(time.Hour)
		os.Exit(0)
	default:
		os.Exit(runTestServer(os.Getenv(testServerEnv) == "stubborn"))
	}
}

type testServer struct {
	mu       sync.Mutex
	out      *bufio.Writer
	received []string
	asks     map[string]json.RawMessage // our request id -> the client request id to answer
	nextAsk  int
}

func runTestServer(stubborn bool) int {
	if stubborn {
		signal.Ignore(syscall.SIGTERM)
	}
	ts := &testServer{out: bufio.NewWriter(os.Stdout), asks: map[string]json.RawMessage{}}
	fmt.Fprintln(os.Stderr, "testserver: started")
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		ts.handle(sc.Bytes())
	}
	if stubborn {
		select {} // ignore EOF too: only SIGKILL ends this one
	}
	return 0
}

type testMsg struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  json.RawMessage `json:"error,omitempty"`
}

func (ts *testServer) write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	ts.writeLine(b)
}

func (ts *testServer) writeLine(b []byte) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.out.Write(b)
	ts.out.WriteByte('\n')
	ts.out.Flush()
}

func (ts *testServer) result(id json.RawMessage, result any) {
	ts.write(map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
}

func (ts *testServer) handle(line []byte) {
	var m testMsg
	if err := json.Unmarshal(line, &m); err != nil {
		fmt.Fprintf(os.Stderr, "testserver: bad input %q\n", line)
		return
	}
	if m.Method == "" { // a response to one of our requests
		ts.mu.Lock()
		clientID, ok := ts.asks[string(m.ID)]
		delete(ts.asks, string(m.ID))
		ts.mu.Unlock()
		if ok {
			ts.result(clientID, map[string]any{"answer": m.Result})
		}
		return
	}
	if m.ID == nil {
		ts.mu.Lock()
		ts.received = append(ts.received, m.Method)
		ts.mu.Unlock()
		return
	}
	var p struct {
		Ms   int    `json:"ms"`
		N    int    `json:"n"`
		Text string `json:"text"`
		Meta struct {
			ProgressToken json.RawMessage `json:"progressToken"`
		} `json:"_meta"`
		ProtocolVersion string `json:"protocolVersion"`
	}
	_ = json.Unmarshal(m.Params, &p)
	switch m.Method {
	case "initialize":
		ts.result(m.ID, map[string]any{
			"protocolVersion": p.ProtocolVersion,
			"capabilities":    map[string]any{"tools": map[string]any{}},
			"serverInfo":      map[string]any{"name": "testserver", "version": "1"},
		})
	case "echo":
		ts.result(m.ID, map[string]any{"params": m.Params, "pid": os.Getpid()})
	case "notify":
		if p.Meta.ProgressToken != nil {
			ts.write(map[string]any{"jsonrpc": "2.0", "method": "notifications/progress",
				"params": map[string]any{"progressToken": p.Meta.ProgressToken, "progress": 1, "total": 2}})
		}
		ts.write(map[string]any{"jsonrpc": "2.0", "method": "notifications/message",
			"params": map[string]any{"level": "info", "data": p.Text}})
		ts.result(m.ID, map[string]any{"notified": true})
	case "ask":
		ts.mu.Lock()
		ts.nextAsk++
		askID := fmt.Sprintf(`"srv-%d"`, ts.nextAsk)
		ts.asks[askID] = m.ID
		ts.mu.Unlock()
		ts.write(map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(askID), "method": "sampling/createMessage",
			"params": map[string]any{"messages": []any{}, "maxTokens": 1}})
	case "received":
		ts.mu.Lock()
		got := append([]string{}, ts.received...)
		ts.mu.Unlock()
		ts.result(m.ID, map[string]any{"received": got})
	case "sleep":
		go func() {
			time.Sleep(time.Duration(p.Ms) * time.Millisecond)
			ts.result(m.ID, map[string]any{"slept": p.Ms})
		}()
	case "crash":
		fmt.Fprintln(os.Stderr, "testserver: crashing on purpose")
		os.Exit(3)
	case "spawn":
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), testServerEnv+"=sleeper")
		if err := cmd.Start(); err != nil {
			ts.write(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -1, "message": err.Error()}})
			return
		}
		ts.result(m.ID, map[string]any{"pid": cmd.Process.Pid})
	case "big":
		ts.result(m.ID, map[string]any{"data": strings.Repeat("x", p.N)})
	case "garbage":
		ts.writeLine([]byte("this is not JSON"))
		ts.result(m.ID, map[string]any{"ok": true})
	default:
		ts.write(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "method not found: " + m.Method}})
	}
}
