package mcpproxy

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
)

// Clients ClientConfig renders for.
const (
	ClientClaudeCode    = "claude-code"
	ClientClaudeDesktop = "claude-desktop"
	ClientJSON          = "json"
)

// MCPRemotePackage is the stdio-to-HTTP bridge Claude Desktop runs to reach
// the proxy (its config file takes only stdio servers), pinned so that what
// users paste keeps working the same way.
const MCPRemotePackage = "mcp-remote@0.15.1"

// desktopAuthVar carries the Authorization value to mcp-remote through the
// environment: mcp-remote expands ${VAR} in --header, and Claude Desktop on
// Windows mangles arguments with spaces, so the argument has none.
const desktopAuthVar = "AGENT_VM_MCP_AUTH"

// ClientConfig renders the configuration entry a user pastes into an MCP
// client so it reaches a proxy at url with the bearer token:
//
//   - claude-code: a .mcp.json document, {"mcpServers": {NAME: {"type": "http", "url", "headers"}}}
//     (the same entry `claude mcp add-json NAME '<entry>'` takes);
//   - claude-desktop: a claude_desktop_config.json document whose entry runs
//     `npx -y mcp-remote URL --header Authorization:${AGENT_VM_MCP_AUTH}`;
//   - json: {"name", "transport": "streamable-http", "url", "headers"} for
//     anything else.
//
// The output is indented JSON ending in a newline. It contains the token.
func ClientConfig(client, name, serverURL, token string) ([]byte, error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("client config name %q: %w", name, err)
	}
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client config url %q must be an absolute http(s) URL", serverURL)
	}
	if err := checkToken(token); err != nil {
		return nil, fmt.Errorf("client config token: %w", err)
	}
	auth := "Bearer " + token
	var doc any
	switch client {
	case ClientClaudeCode:
		type entry struct {
			Type    string            `json:"type"`
			URL     string            `json:"url"`
			Headers map[string]string `json:"headers"`
		}
		doc = struct {
			MCPServers map[string]entry `json:"mcpServers"`
		}{map[string]entry{name: {Type: "http", URL: serverURL, Headers: map[string]string{"Authorization": auth}}}}
	case ClientClaudeDesktop:
		type entry struct {
			Command string            `json:"command"`
			Args    []string          `json:"args"`
			Env     map[string]string `json:"env"`
		}
		doc = struct {
			MCPServers map[string]entry `json:"mcpServers"`
		}{map[string]entry{name: {
			Command: "npx",
			Args:    []string{"-y", MCPRemotePackage, serverURL, "--header", "Authorization:${" + desktopAuthVar + "}"},
			Env:     map[string]string{desktopAuthVar: auth},
		}}}
	case ClientJSON:
		doc = struct {
			Name      string            `json:"name"`
			Transport string            `json:"transport"`
			URL       string            `json:"url"`
			Headers   map[string]string `json:"headers"`
		}{name, "streamable-http", serverURL, map[string]string{"Authorization": auth}}
	default:
		return nil, fmt.Errorf("unknown MCP client %q (hint: use one of %s)", client,
			strings.Join([]string{ClientClaudeCode, ClientClaudeDesktop, ClientJSON}, ", "))
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
