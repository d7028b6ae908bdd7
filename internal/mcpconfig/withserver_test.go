package mcpconfig_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/mcpconfig"
)

// The DevTools server, merged into a guest's file beside what is there
// (another server, another key), and taken out again by name: the file
// is as it was.
func TestDevToolsServerMergedAndRemoved(t *testing.T) {
	d, err := guest.NewDevToolsMCP(guest.DevToolsMCPPrefix, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	srv := mcpconfig.DevToolsServer(d)
	if srv.Type != "stdio" || srv.Command != d.Node() || srv.Args[0] != d.Script() || srv.Args[1] != "--browserUrl=http://127.0.0.1:9222" ||
		srv.Env["CHROME_DEVTOOLS_MCP_NO_UPDATE_CHECKS"] != "1" {
		t.Fatalf("DevToolsServer = %+v", srv)
	}
	start := []byte(`{"theme":"dark","projects":{"/workspace":{"mcpServers":{"mine":{"command":"x"}}}}}`)
	with, err := mcpconfig.Merge(start, "~/.claude.json", guest.Workspace, map[string]mcpconfig.Server{guest.DevToolsMCPName: srv}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Projects map[string]struct {
			MCPServers map[string]mcpconfig.Server `json:"mcpServers"`
		} `json:"projects"`
	}
	if err := json.Unmarshal(with, &doc); err != nil {
		t.Fatal(err)
	}
	got := doc.Projects[guest.Workspace].MCPServers
	if !reflect.DeepEqual(got[guest.DevToolsMCPName], srv) || got["mine"].Command != "x" {
		t.Fatalf("merged servers: %+v", got)
	}
	without, err := mcpconfig.Merge(with, "~/.claude.json", guest.Workspace, nil, []string{guest.DevToolsMCPName})
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	_ = json.Unmarshal(start, &a)
	_ = json.Unmarshal(without, &b)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("after removing it: %s\nwant %s", without, start)
	}
}
