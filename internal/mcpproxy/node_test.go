package mcpproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// These tests put real MCP peers on both sides of the proxy: the reference
// servers from npm (@modelcontextprotocol/server-everything and
// server-filesystem) behind it, and the official TypeScript SDK's client
// (testdata/node/client.mjs) in front of it, over both transports. CI
// installs them with `npm ci --prefix internal/mcpproxy/testdata/node`.

type nodeHarness struct {
	node string // the node binary
	dir  string // testdata/node, absolute
}

func needNode(t *testing.T) nodeHarness {
	t.Helper()
	node := tu.Program(t, "node")
	dir, err := filepath.Abs(filepath.Join("testdata", "node"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"@modelcontextprotocol/sdk", "@modelcontextprotocol/client", "@modelcontextprotocol/server-everything", "@modelcontextprotocol/server-filesystem", "mcp-remote"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p, "package.json")); err != nil {
			tu.Need(t, false, "npm package "+p+" is not installed (hint: npm ci --prefix internal/mcpproxy/testdata/node)")
		}
	}
	return nodeHarness{node: node, dir: dir}
}

func (h nodeHarness) bin(name string) string {
	return filepath.Join(h.dir, "node_modules", ".bin", name)
}

// client runs client.mjs and returns its JSON summary; it fails the test
// with the client's output when the client fails.
func (h nodeHarness) client(t *testing.T, env []string, args ...string) map[string]any {
	t.Helper()
	return h.script(t, "client.mjs", env, args...)
}

// script runs a client script of testdata/node and returns its JSON summary.
func (h nodeHarness) script(t *testing.T, script string, env []string, args ...string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.node, append([]string{filepath.Join(h.dir, script)}, args...)...)
	cmd.Dir = h.dir
	cmd.Env = append(os.Environ(), env...)
	// The client may start a bridge (mcp-remote) of its own: on timeout kill
	// the whole group, and do not wait forever for pipes a straggler holds.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s %s: %v\nstdout:\n%s\nstderr:\n%s", script, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	var summary map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &summary); err != nil {
		t.Fatalf("%s printed %q: %v\nstderr:\n%s", script, stdout.String(), err, stderr.String())
	}
	return summary
}

func (h nodeHarness) servers(t *testing.T) ([]Server, string) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello from the VM\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	return []Server{
		{Name: "everything", Command: h.bin("mcp-server-everything"), Args: []string{"stdio"}},
		{Name: "filesystem", Command: h.bin("mcp-server-filesystem"), Args: []string{dir}},
	}, dir
}

func TestNodeSDKClientThroughProxy(t *testing.T) {
	h := needNode(t)
	servers, dir := h.servers(t)
	tp := startProxy(t, servers, nil)
	token := []string{"MCP_TOKEN=" + testToken}
	for _, transport := range []string{"streamable", "sse"} {
		endpoint := "/mcp"
		if transport == "sse" {
			endpoint = "/sse"
		}
		t.Run(transport+"/everything", func(t *testing.T) {
			s := h.client(t, token, "everything", "transport="+transport, "url="+tp.base+"/servers/everything"+endpoint)
			if s["echo"] != "Echo: hello through the proxy" || s["rootsAsked"] == float64(0) {
				t.Errorf("summary %v", s)
			}
			t.Logf("summary: %v", s)
		})
		t.Run(transport+"/filesystem", func(t *testing.T) {
			s := h.client(t, token, "filesystem", "transport="+transport, "url="+tp.base+"/servers/filesystem"+endpoint, "dir="+dir)
			t.Logf("summary: %v", s)
		})
	}
	waitNoSessions(t, tp)
}

// Both eras at once through one proxy and one stdio server: the SDK's v2
// client pinned to MCP 2026-07-28 (no initialize, no session; the proxy
// initializes a pooled server for it) and the v1 SDK client on 2025-11-25
// (initialize and Mcp-Session-Id; a server per session). Each calls tools.
func TestNodeClients2026And2025Together(t *testing.T) {
	h := needNode(t)
	servers, _ := h.servers(t)
	tp := startProxy(t, servers[:1], nil)
	token := []string{"MCP_TOKEN=" + testToken}
	url := tp.base + "/servers/everything/mcp"
	t.Run("clients", func(t *testing.T) {
		for _, c := range []struct {
			name, script string
			args         []string
		}{
			{"2026-07-28 pinned", "client2026.mjs", []string{"url=" + url, "negotiation=pin"}},
			{"2026-07-28 auto", "client2026.mjs", []string{"url=" + url, "negotiation=auto"}},
			{"2025-11-25", "client.mjs", []string{"everything", "transport=streamable", "url=" + url}},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				s := h.script(t, c.script, token, c.args...)
				t.Logf("summary: %v", s)
				if c.script == "client.mjs" {
					if s["echo"] != "Echo: hello through the proxy" {
						t.Errorf("summary %v", s)
					}
					return
				}
				if s["era"] != "modern" || s["protocolVersion"] != modernProtocolVersion || s["sessionId"] != nil || s["echo"] != "Echo: hello from 2026" {
					t.Errorf("summary %v, want era modern, version %s, no session, the echo", s, modernProtocolVersion)
				}
			})
		}
	})
	if n := pooled(tp); n == 0 {
		t.Error("no pooled server for the 2026-07-28 clients")
	}
	waitNoSessions(t, tp)
}

func TestNodeSDKClientRefused(t *testing.T) {
	h := needNode(t)
	servers, _ := h.servers(t)
	tp := startProxy(t, servers[:1], func(o *Options) { o.AllowedOrigins = []string{"https://claude.ai"} })
	for _, transport := range []string{"streamable", "sse"} {
		url := tp.base + "/mcp"
		if transport == "sse" {
			url = tp.base + "/sse"
		}
		t.Run(transport+"/no token", func(t *testing.T) {
			s := h.client(t, []string{"MCP_TOKEN="}, "refused", "status=401", "transport="+transport, "url="+url)
			t.Logf("refused: %v", s["error"])
		})
		t.Run(transport+"/wrong token", func(t *testing.T) {
			s := h.client(t, []string{"MCP_TOKEN=" + strings.Repeat("0", 32)}, "refused", "status=401", "transport="+transport, "url="+url)
			t.Logf("refused: %v", s["error"])
		})
		t.Run(transport+"/foreign origin", func(t *testing.T) {
			s := h.client(t, []string{"MCP_TOKEN=" + testToken}, "refused", "status=403", "transport="+transport, "url="+url, "origin=https://evil.example")
			t.Logf("refused: %v", s["error"])
		})
	}
	if pids := childPids(t); len(pids) != 0 {
		t.Errorf("refused clients started servers: %v", pids)
	}
	// The allowed origin gets through.
	h.client(t, []string{"MCP_TOKEN=" + testToken}, "everything", "transport=streamable", "url="+tp.base+"/mcp", "origin=https://claude.ai")
}

// What `agent-vm mcp-config --client claude-code` prints, fed to the SDK as
// Claude Code would use it.
func TestNodeClaudeCodeConfigWorks(t *testing.T) {
	h := needNode(t)
	servers, _ := h.servers(t)
	tp := startProxy(t, servers[:1], nil)
	cfg, err := ClientConfig(ClientClaudeCode, "agent-vm-test", tp.base+"/mcp", testToken)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), ".mcp.json")
	if err := os.WriteFile(file, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	h.client(t, []string{"MCP_TOKEN="}, "everything", "transport=streamable", "config="+file)
}

// What `agent-vm mcp-config --client claude-desktop` prints, run as Claude
// Desktop would run it: mcp-remote as a stdio server bridging to the proxy.
// npx is replaced by the locally installed mcp-remote of the same version.
func TestNodeClaudeDesktopConfigWorks(t *testing.T) {
	h := needNode(t)
	servers, _ := h.servers(t)
	tp := startProxy(t, servers[:1], nil)
	cfg, err := ClientConfig(ClientClaudeDesktop, "agent-vm-test", tp.base+"/mcp", testToken)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		MCPServers map[string]struct {
			Command string            `json:"command"`
			Args    []string          `json:"args"`
			Env     map[string]string `json:"env"`
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal(cfg, &doc); err != nil {
		t.Fatal(err)
	}
	entry := doc.MCPServers["agent-vm-test"]
	if entry.Command != "npx" || len(entry.Args) < 2 || entry.Args[0] != "-y" || entry.Args[1] != MCPRemotePackage {
		t.Fatalf("unexpected entry %+v", entry)
	}
	installed := readPackageVersion(t, filepath.Join(h.dir, "node_modules", "mcp-remote", "package.json"))
	if "mcp-remote@"+installed != MCPRemotePackage {
		t.Fatalf("testdata/node has mcp-remote %s, the config pins %s: keep them the same", installed, MCPRemotePackage)
	}
	env := entry.Env
	env["HOME"] = t.TempDir() // mcp-remote keeps state in ~/.mcp-auth
	args := append([]string{filepath.Join(h.dir, "node_modules", "mcp-remote", "dist", "proxy.js")}, entry.Args[2:]...)
	h.client(t, []string{"MCP_TOKEN="}, "everything", "transport=stdio", "command="+h.node, "args="+mustJSON(t, args), "env="+mustJSON(t, env))
}

func readPackageVersion(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct{ Version string }
	if err := json.Unmarshal(b, &pkg); err != nil {
		t.Fatal(err)
	}
	return pkg.Version
}

// pooled counts the idle servers pooled for 2026-07-28 clients.
func pooled(tp *testProxy) int {
	tp.p.mu.Lock()
	defer tp.p.mu.Unlock()
	return pooledLocked(tp)
}

func pooledLocked(tp *testProxy) int {
	n := 0
	for _, list := range tp.p.idle {
		n += len(list)
	}
	return n
}

// waitNoSessions waits for clients' sessions to end (idle pooled servers
// stay) (the SDK client DELETEs
// its Streamable HTTP session; an SSE session ends with its stream).
func waitNoSessions(t *testing.T, tp *testProxy) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := tu.Poll(ctx, "the sessions to close", func() bool {
		tp.p.mu.Lock()
		defer tp.p.mu.Unlock()
		return len(tp.p.sessions) == pooledLocked(tp)
	})
	if err != nil {
		t.Errorf("%v: sessions still open after the clients closed: %v", err, tp.p.sessionCounts())
	}
}
