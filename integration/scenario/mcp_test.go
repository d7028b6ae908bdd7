package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
)

// rpcAnswer is a JSON-RPC response.
type rpcAnswer struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  map[string]any  `json:"result"`
	Error   *struct {
		Code int `json:"code"`
	} `json:"error"`
}

// TestMCPServerScript runs the mcp scenario's stdio MCP server with the
// host's sh (Debian's dash, as in the Debian guest; bash, as in NixOS, when
// present) and checks its answers are JSON-RPC responses a proxy can relay.
func TestMCPServerScript(t *testing.T) {
	script := filepath.Join(t.TempDir(), "mcp-server.sh")
	if err := os.WriteFile(script, []byte(mcpServerScript), 0o644); err != nil {
		t.Fatal(err)
	}
	in := strings.Join([]string{
		initializeRequest,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc": "2.0", "id": "s-7", "method": "ping"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}`,
		`{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"capabilities":{}}}`,
	}, "\n") + "\n"
	for _, shell := range []string{"sh", "bash"} {
		path, err := exec.LookPath(shell)
		if err != nil {
			continue
		}
		t.Run(shell, func(t *testing.T) {
			cmd := exec.Command(path, script)
			cmd.Stdin = strings.NewReader(in)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s %s: %v", shell, script, err)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != 4 {
				t.Fatalf("got %d answers, want 4 (none for the notification):\n%s", len(lines), out)
			}
			var answers []rpcAnswer
			for _, l := range lines {
				var a rpcAnswer
				if err := json.Unmarshal([]byte(l), &a); err != nil || a.JSONRPC != "2.0" {
					t.Fatalf("not a JSON-RPC message: %s (%v)", l, err)
				}
				answers = append(answers, a)
			}
			init := answers[0]
			info, _ := init.Result["serverInfo"].(map[string]any)
			if string(init.ID) != "1" || init.Result["protocolVersion"] != "2025-06-18" || info["name"] != mcpServerName {
				t.Errorf("initialize answered %s", lines[0])
			}
			if string(answers[1].ID) != `"s-7"` || answers[1].Result == nil {
				t.Errorf("ping answered %s", lines[1])
			}
			if string(answers[2].ID) != "3" || answers[2].Error == nil || answers[2].Error.Code != -32601 {
				t.Errorf("tools/list answered %s, want method not found", lines[2])
			}
			if answers[3].Result["protocolVersion"] != "2025-06-18" {
				t.Errorf("initialize without a version answered %s, want the default version", lines[3])
			}
		})
	}
}

// TestMCPChecksAgainstTheRealProxy runs the mcp scenario's HTTP checks
// against agent-vm's own MCP proxy, started on this host the way the
// guest's agent-mcp unit starts it (docs/design.md, modules/agent-mcp.nix),
// serving the scenario's sh MCP server. It proves the checks pass against
// the real thing and that the proxy relays to that server; the VM adds
// only the port forward.
func TestMCPChecksAgainstTheRealProxy(t *testing.T) {
	agentVM := buildAgentVM(t)
	if out, err := exec.Command(agentVM, "mcp-proxy", "--help").CombinedOutput(); err != nil {
		blackbox.SkipOrFail(t, "this tree's agent-vm has no mcp-proxy command yet: %s", harness.LastLine(string(out)))
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "mcp-server.sh")
	cfg := filepath.Join(dir, "mcp.json")
	tokenFile := filepath.Join(dir, "mcp-token")
	token := harness.RandHex(16)
	for p, c := range map[string]string{script: mcpServerScript, cfg: mcpConfig(script), tokenFile: token + "\n"} {
		if err := os.WriteFile(p, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, agentVM, "mcp-proxy", "--config", cfg,
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--token-file", tokenFile)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()

	st := &blackbox.Status{}
	st.MCP.URL = fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	st.MCP.HealthURL = fmt.Sprintf("http://127.0.0.1:%d/health", port)
	st.MCP.Token = token
	// Its own cancel: the deferred one above must end the proxy.
	wctx, stopWaiting := context.WithTimeout(ctx, 30*time.Second)
	defer stopWaiting()
	if err := blackbox.Poll(wctx, "the proxy's /health answering 200", func() bool { return checkMCPHealth(ctx, st) == nil }); err != nil {
		t.Fatalf("%v: %v\nproxy stderr:\n%s", err, checkMCPHealth(ctx, st), stderr.String())
	}
	for name, check := range map[string]func(context.Context, *blackbox.Status) error{
		"initialize": checkInitialize, "auth": checkMCPAuth, "origin": checkMCPOrigin,
	} {
		if err := check(ctx, st); err != nil {
			t.Errorf("%s: %v\nproxy stderr:\n%s", name, err, stderr.String())
		}
	}
}

// buildAgentVM builds this tree's agent-vm into the test's own directory.
func buildAgentVM(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agent-vm")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/agent-vm").CombinedOutput(); err != nil {
		t.Fatalf("go build ../../cmd/agent-vm: %v\n%s", err, out)
	}
	return bin
}

// freePort is a TCP port on 127.0.0.1 that nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
