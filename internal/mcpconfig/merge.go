package mcpconfig

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"

	"github.com/agent-vm/agent-vm/internal/guest"
)

// Merge writes servers into the local scope of project (the guest's
// workspace) in a guest's ~/.claude.json, keeping everything else in it:
// its other keys, the project's other keys, and servers the guest added
// itself. previous are the servers an earlier sync wrote: those the host no
// longer has are removed. current is the file as it is (empty when there is
// none); path is only for messages.
//
// The local scope is the one that wins over the project's .mcp.json, which
// the guest sees as well (shared): a server named in both is the synced one.
func Merge(current []byte, path, project string, servers map[string]Server, previous []string) ([]byte, error) {
	doc := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(current)) > 0 {
		if err := json.Unmarshal(current, &doc); err != nil {
			return nil, jsonError(path, current, err)
		}
	}
	projects := map[string]json.RawMessage{}
	if err := decodeField(doc, "projects", &projects, path); err != nil {
		return nil, err
	}
	proj := map[string]json.RawMessage{}
	if err := decodeField(projects, project, &proj, path); err != nil {
		return nil, err
	}
	mcp := map[string]json.RawMessage{}
	if err := decodeField(proj, "mcpServers", &mcp, path); err != nil {
		return nil, err
	}
	for _, name := range previous {
		if _, ok := servers[name]; !ok {
			delete(mcp, name)
		}
	}
	for name, s := range servers {
		b, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		mcp[name] = b
	}
	var err error
	if proj["mcpServers"], err = json.Marshal(mcp); err != nil {
		return nil, err
	}
	if projects[project], err = json.Marshal(proj); err != nil {
		return nil, err
	}
	if doc["projects"], err = json.Marshal(projects); err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// DevToolsServer is the guest's registration of the DevTools MCP server
// d (guest.DevToolsMCPName): stdio, reaching the host browser through the
// DevTools relay at the guest's 127.0.0.1:guest.DevToolsPort.
func DevToolsServer(d guest.DevToolsMCP) Server {
	prog, args := d.Command(guest.DevToolsPort)
	return Server{Type: "stdio", Command: prog, Args: args, Env: maps.Clone(guest.DevToolsMCPEnv)}
}

// decodeField decodes m[key] into v when it is there and not null.
func decodeField(m map[string]json.RawMessage, key string, v any, path string) error {
	raw, ok := m[key]
	if !ok || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s: %q is not a JSON object (hint: fix or remove the file in the VM)", path, key)
	}
	return nil
}

// Fragment is what Merge adds, as a document of its own: what `mcp sync
// --dry-run` shows.
func Fragment(project string, servers map[string]Server) ([]byte, error) {
	doc := map[string]any{"projects": map[string]any{project: map[string]any{"mcpServers": servers}}}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
