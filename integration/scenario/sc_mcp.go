package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
)

func mcpScenario() harness.Scenario {
	return harness.Scenario{
		Name:    "mcp",
		Summary: "agent-mcp through the forwarded port: token required, foreign origins refused, loopback only; mcp sync; the network's containment; the browser bridges",
		NeedsVM: true,
		// Its VMs' first boot is not what it checks.
		Template: "none",
		Verbs:    []string{"create", "status", "start", "stop", "destroy", "exec", "mcp", "port", "net", "browser"},
		Run:      runMCP,
	}
}

const mcpBranch = "itest/mcp"

// mcpServerName is what the workspace's MCP server calls itself; seeing it
// in the answer proves the proxy relayed to the workspace's server.
const mcpServerName = "itest-mcp"

// mcpServerScript is a minimal stdio MCP server in POSIX sh (both guest
// flavours have sh and sed): it answers initialize (with the client's
// protocol version) and ping, and refuses any other request.
const mcpServerScript = `#!/bin/sh
# A minimal stdio MCP server for agent-vm's integration test.
field() { printf '%s\n' "$line" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\($2\).*/\1/p"; }
while IFS= read -r line; do
	id=$(field id '"[^"]*"\|[0-9][0-9]*')
	[ -n "$id" ] || continue # a notification or a response
	case $line in
	*'"method"'*'"initialize"'*)
		pv=$(field protocolVersion '"[^"]*"')
		printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%s,"capabilities":{},"serverInfo":{"name":"` + mcpServerName + `","version":"1.0.0"}}}\n' "$id" "${pv:-\"2025-06-18\"}"
		;;
	*'"method"'*'"ping"'*)
		printf '{"jsonrpc":"2.0","id":%s,"result":{}}\n' "$id"
		;;
	*'"method"'*)
		printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"method not found"}}\n' "$id"
		;;
	esac
done
`

// mcpConfig is a .mcp.json (Claude's mcpServers shape) with the one
// server above, run from script; agent-mcp serves a single server at /mcp.
func mcpConfig(script string) string {
	b, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{
		"itest": map[string]any{"command": "sh", "args": []string{script}}}})
	return string(b) + "\n"
}

func runMCP(ctx context.Context, s *harness.S) {
	var st *blackbox.Status
	var net *netSetup
	s.Step(ctx, "make a git repo with an MCP server and create a VM; expose one host port and allow a test name", func() (err error) {
		if _, err = s.Prepare(ctx, mcpBranch, map[string]string{
			".mcp.json": mcpConfig("/workspace/.itest/mcp-server.sh"), ".itest/mcp-server.sh": mcpServerScript}); err != nil {
			return err
		}
		net, err = newNetSetup(ctx, s, mcpBranch)
		return err
	})
	s.Step(ctx, "start it", func() (err error) {
		if _, err = s.Boot(ctx, "start", mcpBranch, net.env...); err != nil {
			return err
		}
		if st, err = s.Healthy(ctx, mcpBranch); err != nil {
			return err
		}
		if st.MCP.Token == "" {
			return harness.Failf(nil, "status --json shows no mcp.token")
		}
		return nil
	})
	s.Step(ctx, "/health answers 200 without a token", func() error { return checkMCPHealth(ctx, st) })
	s.Step(ctx, "initialize with the token: the workspace's server answers", func() error {
		return checkInitialize(ctx, st)
	})
	s.Step(ctx, "without the token, or with a wrong one: 401", func() error { return checkMCPAuth(ctx, st) })
	s.Step(ctx, "a foreign browser Origin is refused: 403", func() error { return checkMCPOrigin(ctx, st) })
	s.Step(ctx, "the forwarded ports listen on 127.0.0.1 only", func() error {
		return checkLoopbackOnly(ctx, s, st)
	})
	s.Step(ctx, "mcp sync writes the host's servers into the guest's ~/.claude.json, without their values", func() error {
		return checkMCPSync(ctx, s)
	})
	netSteps(ctx, s, mcpBranch, net)
	browserSteps(ctx, s, mcpBranch)
}

// checkMCPHealth: /health answers 200 to anyone (no token).
func checkMCPHealth(ctx context.Context, st *blackbox.Status) error {
	r, err := harness.HTTP(ctx, nil, http.MethodGet, st.MCP.HealthURL, nil, nil)
	if err == nil && r.Status != http.StatusOK {
		err = fmt.Errorf("GET %s: HTTP %d, want 200: %s", st.MCP.HealthURL, r.Status, r.Body)
	}
	return err
}

// checkMCPAuth: the MCP endpoint refuses a request without the bearer
// token, with a wrong one, or with the token but not as a Bearer.
func checkMCPAuth(ctx context.Context, st *blackbox.Status) error {
	for _, auth := range []string{"", "Bearer not-the-token", "Bearer " + st.MCP.Token + "x", st.MCP.Token} {
		h := map[string]string{}
		if auth != "" {
			h["Authorization"] = auth
		}
		code, body, err := mcpPost(ctx, st.MCP.URL, h)
		if err != nil {
			return err
		}
		if code != http.StatusUnauthorized {
			return fmt.Errorf("POST %s with Authorization %q: HTTP %d, want 401: %s", st.MCP.URL, redact(auth, st.MCP.Token), code, body)
		}
	}
	return nil
}

// checkMCPOrigin: a browser page from a foreign origin is refused even
// with the token (DNS rebinding, a page probing localhost).
func checkMCPOrigin(ctx context.Context, st *blackbox.Status) error {
	h := map[string]string{"Authorization": "Bearer " + st.MCP.Token, "Origin": "https://evil.example"}
	code, body, err := mcpPost(ctx, st.MCP.URL, h)
	if err != nil {
		return err
	}
	if code != http.StatusForbidden {
		return fmt.Errorf("POST %s from Origin https://evil.example: HTTP %d, want 403: %s", st.MCP.URL, code, body)
	}
	return nil
}

// initializeRequest is an MCP initialize request as a client sends it.
const initializeRequest = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
	`"capabilities":{},"clientInfo":{"name":"agent-vm-integration-test","version":"1"}}}`

// checkInitialize posts initialize with the token and reads the JSON-RPC
// answer, as JSON or as an SSE stream (the client accepts both).
func checkInitialize(ctx context.Context, st *blackbox.Status) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.MCP.URL, strings.NewReader(initializeRequest))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+st.MCP.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", st.MCP.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("POST %s (initialize, with the token): HTTP %d, want 200: %s", st.MCP.URL, resp.StatusCode, body)
	}
	msg, err := harness.ReadJSONRPC(resp)
	if err != nil {
		return fmt.Errorf("POST %s (initialize): %w", st.MCP.URL, err)
	}
	var answer struct {
		ID     json.RawMessage `json:"id"`
		Result struct {
			ProtocolVersion string `json:"protocolVersion"`
			ServerInfo      struct {
				Name string `json:"name"`
			} `json:"serverInfo"`
		} `json:"result"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(msg, &answer); err != nil {
		return fmt.Errorf("the answer %s is not a JSON-RPC response: %w", msg, err)
	}
	switch {
	case len(answer.Error) > 0:
		return fmt.Errorf("initialize was answered with an error: %s", answer.Error)
	case string(answer.ID) != "1":
		return fmt.Errorf("the answer has id %s, want 1: %s", answer.ID, msg)
	case answer.Result.ProtocolVersion == "":
		return fmt.Errorf("the initialize result has no protocolVersion: %s", msg)
	case answer.Result.ServerInfo.Name != mcpServerName:
		return fmt.Errorf("the answer comes from server %q, want the workspace's %q (/workspace/.mcp.json): %s", answer.Result.ServerInfo.Name, mcpServerName, msg)
	}
	return nil
}

// mcpPost posts initialize with the given headers and returns the status.
func mcpPost(ctx context.Context, url string, headers map[string]string) (int, string, error) {
	h := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
	for k, v := range headers {
		h[k] = v
	}
	r, err := harness.HTTP(ctx, nil, http.MethodPost, url, []byte(initializeRequest), h)
	return r.Status, r.Body, err
}

// redact hides the token in a header value shown in a failure.
func redact(s, token string) string {
	if token == "" {
		return s
	}
	return strings.ReplaceAll(s, token, "<token>")
}

// checkLoopbackOnly dials the VM's forwarded ports on each of the host's
// other addresses: none may answer, so nothing outside this host reaches
// the VM.
func checkLoopbackOnly(ctx context.Context, s *harness.S, st *blackbox.Status) error {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return err
	}
	tried := 0
	for _, a := range addrs {
		ipnet, ok := a.(*net.IPNet)
		if !ok || ipnet.IP.IsLoopback() || ipnet.IP.IsLinkLocalUnicast() {
			continue
		}
		for _, port := range []int{st.Ports.SSH, st.Ports.MCP} {
			tried++
			addr := net.JoinHostPort(ipnet.IP.String(), strconv.Itoa(port))
			d := net.Dialer{Timeout: 2 * time.Second}
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				conn.Close()
				return fmt.Errorf("the VM's port %d answers on %s: it must listen on 127.0.0.1 only", port, addr)
			}
		}
	}
	if tried == 0 {
		s.Notef("this host has no address besides loopback to try")
	} else {
		s.Notef("refused on %d other address/port pairs", tried)
	}
	return nil
}
