package hostbrowser

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// The guest's DevTools MCP server, for real, on this host: installed by
// the guest's install script (under a prefix of the test's own), run with
// the guest's command line against a launched Chromium, and spoken to
// over stdio as Claude Code speaks to it, through the DevTools relay's
// relay (bridge.CDPRelay) as in a VM: a page the test serves is opened,
// navigated and read back; a host file is not opened. What a real boot
// does in the guest, less the held connection that carries the relay.
func TestDevToolsMCPDrivesTheLaunchedBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("installs Node.js and chrome-devtools-mcp from the npm registry")
	}
	sh := testutil.Program(t, "sh")
	testutil.Program(t, "npm")
	o := launchOptions(t)
	mcp, err := guest.NewDevToolsMCP(filepath.Join(t.TempDir(), "devtools-mcp"), runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, "chrome-devtools-mcp's install")
	install := exec.CommandContext(ctx, sh, "-c", mcp.Install())
	if out, err := install.CombinedOutput(); err != nil {
		testutil.SkipOrFail(t, "installing %s: %v\n%s", strings.Join(mcp.Packages(), " "), err, out)
	}
	if out, err := exec.CommandContext(ctx, sh, "-c", mcp.Install()).CombinedOutput(); err != nil || !strings.Contains(string(out), "is installed in") {
		t.Errorf("the install script run again: %v\n%s; want it to find the pinned versions there", err, out)
	}

	if _, err := Launch(ctx, o); err != nil {
		t.Fatal(err)
	}
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "<!doctype html><title>agent-vm page %s</title>", strings.TrimPrefix(r.URL.Path, "/"))
	}))
	defer site.Close()

	// A page of the browser's own is open beside the web's, as in a
	// user's browser: the relay keeps chrome-devtools-mcp out of it, and
	// the server still works with the rest.
	v, err := bridge.ProbeDevTools(ctx, bridge.DevToolsAddr(o.Port))
	if err != nil {
		t.Fatal(err)
	}
	dialCDP(t, v.WebSocketURL).mustCall("", "Target.createTarget", map[string]any{"url": "chrome://version"})
	relay, logPath := relayFor(t, bridge.DevToolsAddr(o.Port))
	prog, args := mcp.Command(relay)
	c := startMCP(t, ctx, prog, args)
	init := c.call("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "agent-vm-test", "version": "0"}})
	if !strings.Contains(string(init), `"name":"chrome_devtools"`) {
		t.Errorf("initialize: %s", init)
	}
	c.notify("notifications/initialized")

	var list struct {
		Tools []struct {
			Name        string `json:"name"`
			InputSchema struct {
				Required []string `json:"required"`
			} `json:"inputSchema"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(c.call("tools/list", map[string]any{}), &list); err != nil {
		t.Fatal(err)
	}
	required := map[string][]string{}
	for _, tool := range list.Tools {
		required[tool.Name] = tool.InputSchema.Required
	}
	for name, want := range map[string]string{"new_page": "[url]", "navigate_page": "[pageId]", "evaluate_script": "[pageId]", "list_pages": "[]"} {
		if got, ok := required[name]; !ok || fmt.Sprint(got) != want {
			t.Errorf("tool %s: required %v (listed %v), want %s", name, got, ok, want)
		}
	}

	opened := c.tool("new_page", map[string]any{"url": site.URL + "/one"})
	m := regexp.MustCompile(`(?m)^(\d+): agent-vm page one `).FindStringSubmatch(opened)
	if m == nil {
		t.Fatalf("new_page: %q, want the page listed with its id", opened)
	}
	var page int
	fmt.Sscan(m[1], &page)
	if got := c.tool("navigate_page", map[string]any{"pageId": page, "type": "url", "url": site.URL + "/two"}); !strings.Contains(got, "Successfully navigated to "+site.URL+"/two") {
		t.Errorf("navigate_page: %q", got)
	}
	if got := c.tool("evaluate_script", map[string]any{"pageId": page, "function": "() => document.title"}); !strings.Contains(got, `"agent-vm page two"`) {
		t.Errorf("evaluate_script: %q, want the page's title", got)
	}
	if got := c.tool("list_pages", map[string]any{}); !strings.Contains(got, fmt.Sprintf("%d: agent-vm page two (%s/two)", page, site.URL)) {
		t.Errorf("list_pages: %q", got)
	}
	secret := filepath.Join(t.TempDir(), "secret.txt")
	os.WriteFile(secret, []byte("host-secret-42"), 0o644)
	if got, isError := c.toolResult("navigate_page", map[string]any{"pageId": page, "type": "url", "url": "file://" + secret}); !isError && strings.Contains(got, "Successfully navigated") {
		t.Errorf("navigate_page to a host file: %q; want the relay's refusal", got)
	} else {
		t.Logf("navigate_page to a host file: %q", got)
	}
	if got := c.tool("evaluate_script", map[string]any{"pageId": page, "function": "() => document.body.innerText"}); strings.Contains(got, "host-secret-42") {
		t.Errorf("the page shows the host file: %q", got)
	}
	es, _ := egress.ReadLog(logPath)
	for _, e := range es {
		t.Logf("refused: %s %s (%s)", e.Request, e.URL, e.Rule)
	}
	if len(es) == 0 || es[len(es)-1].Request != "Page.navigate" {
		t.Errorf("the net log: %+v; want the refused Page.navigate", es)
	}
}

// mcpClient speaks MCP (JSON-RPC, one message a line) to a server's stdio.
type mcpClient struct {
	t     *testing.T
	in    io.Writer
	lines chan []byte
	id    int
}

func startMCP(t *testing.T, ctx context.Context, prog string, args []string) *mcpClient {
	t.Helper()
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Env = os.Environ()
	for k, v := range guest.DevToolsMCPEnv {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("the server's stderr:\n%s", stderr.String())
		}
	})
	c := &mcpClient{t: t, in: in, lines: make(chan []byte)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			c.lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(c.lines)
	}()
	return c
}

func (c *mcpClient) send(msg map[string]any) {
	c.t.Helper()
	msg["jsonrpc"] = "2.0"
	b, err := json.Marshal(msg)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
}

func (c *mcpClient) notify(method string) { c.send(map[string]any{"method": method}) }

// call sends a request and returns its result, skipping the server's own
// notifications.
func (c *mcpClient) call(method string, params any) json.RawMessage {
	c.t.Helper()
	c.id++
	c.send(map[string]any{"id": c.id, "method": method, "params": params})
	timeout := time.After(time.Minute)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("%s: the server closed its output", method)
			}
			var r struct {
				ID     *int            `json:"id"`
				Result json.RawMessage `json:"result"`
				Error  json.RawMessage `json:"error"`
			}
			if err := json.Unmarshal(line, &r); err != nil {
				c.t.Fatalf("%s: %q is not JSON-RPC: %v", method, line, err)
			}
			if r.ID == nil || *r.ID != c.id {
				continue
			}
			if r.Error != nil {
				c.t.Fatalf("%s: error %s", method, r.Error)
			}
			return r.Result
		case <-timeout:
			c.t.Fatalf("%s: no answer within a minute", method)
		}
	}
}

// tool calls a tool and returns its text, failing on a tool error.
func (c *mcpClient) tool(name string, args map[string]any) string {
	c.t.Helper()
	text, isError := c.toolResult(name, args)
	if isError {
		c.t.Fatalf("tool %s: %s", name, text)
	}
	return text
}

// toolResult calls a tool and returns its text and whether it is an error.
func (c *mcpClient) toolResult(name string, args map[string]any) (string, bool) {
	c.t.Helper()
	var r struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	}
	if err := json.Unmarshal(c.call("tools/call", map[string]any{"name": name, "arguments": args}), &r); err != nil {
		c.t.Fatal(err)
	}
	var text strings.Builder
	for _, p := range r.Content {
		text.WriteString(p.Text)
	}
	return text.String(), r.IsError
}
