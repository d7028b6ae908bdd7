// Package mcpconfig reads the MCP servers a host's Claude Code is configured
// with and turns them into the equivalent for a VM's guest: the pure part of
// `agent-vm mcp sync` (no I/O but reading the files it is given).
//
// Where Claude Code keeps MCP servers (its docs, "MCP installation scopes",
// checked against its issue tracker):
//
//   - user scope: the top-level "mcpServers" of ~/.claude.json, or of
//     $CLAUDE_CONFIG_DIR/.claude.json when that variable is set;
//   - local scope: "projects"[<the project's absolute path>]."mcpServers" in
//     the same file;
//   - project scope: the project's .mcp.json, {"mcpServers": {...}}.
//
// A name defined in several scopes resolves local first, then project, then
// user. An entry is a stdio server ({"command", "args", "env"}, "type"
// "stdio" or absent) or a remote one ({"type": "http"|"sse", "url",
// "headers"}). Claude Code expands ${VAR} and ${VAR:-default} in command,
// args, env, url and headers from its own environment; an unset ${VAR}
// without a default stays as written.
package mcpconfig

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Scopes, highest precedence first.
const (
	ScopeLocal   = "local"
	ScopeProject = "project"
	ScopeUser    = "user"
)

// ConfigDirEnv relocates Claude Code's configuration, .claude.json included.
const ConfigDirEnv = "CLAUDE_CONFIG_DIR"

// HostFiles are where a host's Claude Code keeps the MCP servers of one
// project.
type HostFiles struct {
	// ClaudeJSON holds the user scope and the local scopes of all projects.
	ClaudeJSON string
	// Project is the project's absolute path: its local scope's key.
	Project string
	// MCPJSON is the project scope, the project's .mcp.json.
	MCPJSON string
}

// Locate returns the files Claude Code reads for the project at project
// (absolute), for a user whose home is home.
func Locate(getenv func(string) string, home, project string) HostFiles {
	claudeJSON := filepath.Join(home, ".claude.json")
	if dir := getenv(ConfigDirEnv); dir != "" {
		claudeJSON = filepath.Join(dir, ".claude.json")
	}
	f := HostFiles{ClaudeJSON: claudeJSON, Project: project}
	if project != "" {
		f.MCPJSON = filepath.Join(project, ".mcp.json")
	}
	return f
}

// Server is one mcpServers entry in Claude Code's shape.
type Server struct {
	Type    string            `json:"type,omitempty"`
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// knownFields are the Server fields; others (oauth, headersHelper, timeout
// ...) are not carried into the guest, and the report says so.
var knownFields = map[string]bool{"type": true, "command": true, "args": true, "env": true, "url": true, "headers": true}

// Entry is a host server and where it was found.
type Entry struct {
	Name   string
	Scope  string // ScopeLocal, ScopeProject or ScopeUser
	File   string
	Server Server
	// Dropped are the entry's fields that are not carried over.
	Dropped []string
}

// Host is what a host's Claude Code would use in one project.
type Host struct {
	Files    HostFiles
	Servers  []Entry // the effective servers, sorted by name
	Shadowed []Entry // same-named entries of lower scopes, which lose
}

// Load reads the host's files. Missing files hold no servers; a file that
// is not valid JSON is an error naming it, with the line and column.
func Load(f HostFiles) (Host, error) {
	h := Host{Files: f}
	var user, local, project map[string]json.RawMessage
	if f.ClaudeJSON != "" {
		var doc struct {
			MCPServers map[string]json.RawMessage `json:"mcpServers"`
			Projects   map[string]struct {
				MCPServers map[string]json.RawMessage `json:"mcpServers"`
			} `json:"projects"`
		}
		if err := readJSON(f.ClaudeJSON, &doc); err != nil {
			return Host{}, err
		}
		user = doc.MCPServers
		if f.Project != "" {
			local = doc.Projects[f.Project].MCPServers
		}
	}
	if f.MCPJSON != "" {
		var doc struct {
			MCPServers map[string]json.RawMessage `json:"mcpServers"`
		}
		if err := readJSON(f.MCPJSON, &doc); err != nil {
			return Host{}, err
		}
		project = doc.MCPServers
	}
	seen := map[string]bool{}
	for _, s := range []struct {
		scope, file string
		servers     map[string]json.RawMessage
	}{{ScopeLocal, f.ClaudeJSON, local}, {ScopeProject, f.MCPJSON, project}, {ScopeUser, f.ClaudeJSON, user}} {
		for _, name := range sortedKeys(s.servers) {
			e, err := decodeEntry(name, s.scope, s.file, s.servers[name])
			if err != nil {
				return Host{}, err
			}
			if seen[name] {
				h.Shadowed = append(h.Shadowed, e)
				continue
			}
			seen[name] = true
			h.Servers = append(h.Servers, e)
		}
	}
	sort.Slice(h.Servers, func(i, j int) bool { return h.Servers[i].Name < h.Servers[j].Name })
	return h, nil
}

// readJSON decodes a file; a missing one leaves v as it is.
func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading Claude Code's MCP configuration: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return jsonError(path, data, err)
	}
	return nil
}

// jsonError names the file, and the line and column a syntax or type error
// is at.
func jsonError(path string, data []byte, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		line, col := LineCol(data, syn.Offset)
		return fmt.Errorf("%s:%d:%d: not valid JSON: %v (hint: fix the file there; agent-vm never changes it)", path, line, col, syn)
	case errors.As(err, &typ):
		line, col := LineCol(data, typ.Offset)
		return fmt.Errorf("%s:%d:%d: %q must not be a JSON %s (hint: fix the file there; agent-vm never changes it)", path, line, col, typ.Field, typ.Value)
	}
	return fmt.Errorf("%s: %w", path, err)
}

func decodeEntry(name, scope, file string, raw json.RawMessage) (Entry, error) {
	e := Entry{Name: name, Scope: scope, File: file}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return e, fmt.Errorf("%s: MCP server %q must be a JSON object", file, name)
	}
	for k := range fields {
		if !knownFields[k] {
			e.Dropped = append(e.Dropped, k)
		}
	}
	sort.Strings(e.Dropped)
	if err := json.Unmarshal(raw, &e.Server); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			return e, fmt.Errorf("%s: MCP server %q: %q must not be a JSON %s", file, name, typ.Field, typ.Value)
		}
		return e, fmt.Errorf("%s: MCP server %q: %w", file, name, err)
	}
	e.Server.Type = strings.TrimSpace(e.Server.Type)
	return e, nil
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K { return slices.Sorted(maps.Keys(m)) }
