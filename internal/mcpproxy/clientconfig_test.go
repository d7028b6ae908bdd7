package mcpproxy

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

const (
	goldenURL   = "http://127.0.0.1:40123/mcp"
	goldenToken = "0123456789abcdef0123456789abcdef"
)

func TestClientConfigGolden(t *testing.T) {
	for _, client := range []string{ClientClaudeCode, ClientClaudeDesktop, ClientJSON} {
		t.Run(client, func(t *testing.T) {
			got, err := ClientConfig(client, "agent-vm-feat-x", goldenURL, goldenToken)
			if err != nil {
				t.Fatal(err)
			}
			tu.Golden(t, filepath.Join("testdata", "clientconfig", client+".json"), got)
		})
	}
}

// The renderings are valid JSON of the shape each client reads, carrying the
// URL and the Authorization header.
func TestClientConfigShapes(t *testing.T) {
	type entry struct {
		Type    string            `json:"type"`
		URL     string            `json:"url"`
		Headers map[string]string `json:"headers"`
		Command string            `json:"command"`
		Args    []string          `json:"args"`
		Env     map[string]string `json:"env"`
	}
	parse := func(client string) map[string]entry {
		out, err := ClientConfig(client, "vm", goldenURL, goldenToken)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			MCPServers map[string]entry `json:"mcpServers"`
		}
		dec := json.NewDecoder(bytes.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("%s: not the mcpServers shape: %v\n%s", client, err, out)
		}
		return doc.MCPServers
	}
	code := parse(ClientClaudeCode)["vm"]
	if code.Type != "http" || code.URL != goldenURL || code.Headers["Authorization"] != "Bearer "+goldenToken {
		t.Errorf("claude-code entry %+v", code)
	}
	desk := parse(ClientClaudeDesktop)["vm"]
	args := strings.Join(desk.Args, " ")
	if desk.Command != "npx" || !strings.Contains(args, MCPRemotePackage+" "+goldenURL+" --header Authorization:${AGENT_VM_MCP_AUTH}") ||
		desk.Env["AGENT_VM_MCP_AUTH"] != "Bearer "+goldenToken {
		t.Errorf("claude-desktop entry %+v", desk)
	}
	for _, a := range desk.Args {
		if strings.Contains(a, " ") {
			t.Errorf("argument %q has a space, which Claude Desktop on Windows mangles", a)
		}
	}
	out, _ := ClientConfig(ClientJSON, "vm", goldenURL, goldenToken)
	var generic struct {
		Name, Transport, URL string
		Headers              map[string]string
	}
	if err := json.Unmarshal(out, &generic); err != nil || generic.URL != goldenURL || generic.Headers["Authorization"] != "Bearer "+goldenToken || generic.Name != "vm" {
		t.Errorf("json: %+v, %v", generic, err)
	}
}

func TestClientConfigRefusesBadInput(t *testing.T) {
	for _, c := range []struct{ client, name, url, token, want string }{
		{"cursor", "vm", goldenURL, goldenToken, "unknown MCP client \"cursor\" (hint: use one of claude-code, claude-desktop, json)"},
		{ClientJSON, "a b", goldenURL, goldenToken, "invalid name"},
		{ClientJSON, "vm", "127.0.0.1:8000/mcp", goldenToken, "must be an absolute http(s) URL"},
		{ClientJSON, "vm", goldenURL, "", "token is empty"},
	} {
		if _, err := ClientConfig(c.client, c.name, c.url, c.token); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c, err, c.want)
		}
	}
}
