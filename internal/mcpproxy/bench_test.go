package mcpproxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// Benchmarks: what the proxy adds to a request compared with speaking stdio
// to the same server directly, and how it behaves with 50 sessions at once.
//
//	go test ./internal/mcpproxy -run '^$' -bench . -benchtime 2000x
//
// "Direct" runs the server as a client launching it would; "Proxy" sends the
// same request as an HTTP POST on an open Streamable HTTP session.

const benchEcho = `{"jsonrpc":"2.0","id":%d,"method":%s,"params":%s}`

// stdioPeer speaks newline-delimited JSON-RPC to a server process.
type stdioPeer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startStdioPeer(b *testing.B, srv Server) *stdioPeer {
	b.Helper()
	path, err := resolveCommand(srv)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(path, srv.Args...)
	cmd.Env = childEnv(srv.Env)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &stdioPeer{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20)}
	b.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	p.call(b, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}`)
	fmt.Fprintln(p.in, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return p
}

// call sends one request and reads lines until its response (skipping
// notifications the server sends meanwhile).
func (p *stdioPeer) call(b *testing.B, req string) {
	if _, err := io.WriteString(p.in, req+"\n"); err != nil {
		b.Fatal(err)
	}
	for {
		line, err := p.out.ReadBytes('\n')
		if err != nil {
			b.Fatal(err)
		}
		if !strings.Contains(string(line), `"method"`) {
			return
		}
	}
}

type benchCase struct {
	name   string
	server func(b *testing.B) Server
	method string // JSON string
	params string // JSON
}

func benchCases() []benchCase {
	return []benchCase{
		{"testserver", func(b *testing.B) Server { return testServerCmd(b, "s", "1") }, `"echo"`, `{"message":"hello"}`},
		{"everything", func(b *testing.B) Server {
			dir, _ := filepath.Abs(filepath.Join("testdata", "node", "node_modules", ".bin"))
			if _, err := os.Stat(filepath.Join(dir, "mcp-server-everything")); err != nil {
				tu.SkipOrFail(b, "npm packages not installed (npm ci --prefix internal/mcpproxy/testdata/node)")
			}
			return Server{Name: "s", Command: filepath.Join(dir, "mcp-server-everything"), Args: []string{"stdio"}}
		}, `"tools/call"`, `{"name":"echo","arguments":{"message":"hello"}}`},
	}
}

func BenchmarkDirectStdio(b *testing.B) {
	for _, c := range benchCases() {
		b.Run(c.name, func(b *testing.B) {
			p := startStdioPeer(b, c.server(b))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p.call(b, fmt.Sprintf(benchEcho, i+1, c.method, c.params))
			}
		})
	}
}

func BenchmarkProxyStreamable(b *testing.B) {
	for _, c := range benchCases() {
		b.Run(c.name, func(b *testing.B) {
			tp := startProxy(b, []Server{c.server(b)}, func(o *Options) { o.Logger = nil })
			sid := tp.initialize("/mcp")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := benchPost(tp, sid, fmt.Sprintf(benchEcho, i+1, c.method, c.params)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchPost(tp *testProxy, sid, body string) error {
	req, _ := http.NewRequest("POST", tp.base+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(hdrSessionID, sid)
	resp, err := tp.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// BenchmarkProxy50Sessions opens 50 sessions (50 server processes), then
// sends requests on all of them at once. ns/op is per request across all
// sessions; open-50-sessions-ms is how long opening the 50 sessions (50
// initialize requests at once, each starting a server) took.
func BenchmarkProxy50Sessions(b *testing.B) {
	const sessions = 50
	for _, c := range benchCases() {
		b.Run(c.name, func(b *testing.B) {
			srv := c.server(b)
			tp := startProxy(b, []Server{srv}, func(o *Options) {
				o.Logger = nil
				o.MaxSessions = sessions
			})
			tp.client.Transport.(*http.Transport).MaxIdleConnsPerHost = sessions
			sids := make([]string, sessions)
			var wg sync.WaitGroup
			start := time.Now()
			for i := range sids {
				wg.Add(1)
				go func() { defer wg.Done(); sids[i] = tp.initialize("/mcp") }()
			}
			wg.Wait()
			opened := time.Since(start)
			b.ResetTimer()
			for i := range sids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := i; j < b.N; j += sessions {
						if err := benchPost(tp, sids[i], fmt.Sprintf(benchEcho, j+1, c.method, c.params)); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(opened.Milliseconds()), "open-50-sessions-ms") // after ResetTimer, which drops metrics
		})
	}
}

// BenchmarkHTTPBaseline is the floor under BenchmarkProxyStreamable: the same
// client and net/http server on loopback, answering a fixed JSON-RPC
// response without any relaying.
func BenchmarkHTTPBaseline(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`+"\n")
	})}
	go srv.Serve(ln)
	defer srv.Close()
	tp := &testProxy{base: "http://" + ln.Addr().String(), client: &http.Client{Transport: &http.Transport{}}}
	defer tp.client.CloseIdleConnections()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := benchPost(tp, "x", fmt.Sprintf(benchEcho, i+1, `"echo"`, `{}`)); err != nil {
			b.Fatal(err)
		}
	}
}
