package mcpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/agent-vm/agent-vm/internal/mcpconfig"
)

// Config is the set of stdio MCP servers the proxy serves, read from a file
// in Claude's mcpServers shape, so a project's .mcp.json works as it is:
//
//	{"mcpServers": {"NAME": {"command": "npx", "args": ["-y", "pkg"], "env": {"K": "V"}, "cwd": "dir"}}}
//
// ${VAR} and ${VAR:-default} in command, args, env values and cwd expand from
// the proxy's environment, as Claude Code does.
type Config struct {
	Path    string    // the file it was read from
	Servers []Server  // the stdio servers, sorted by name
	Skipped []Skipped // entries that are not stdio servers, left out
}

// Server is one named stdio MCP server.
type Server struct {
	Name    string            // used in URLs: /servers/NAME/mcp
	Command string            // a program on PATH, or a path (relative ones resolve against Dir)
	Args    []string          //
	Env     map[string]string // added to the proxy's environment
	Dir     string            // working directory; "" means the proxy's own
	// Problem, when set, says why this server cannot start, found while
	// loading (an unset ${VAR}). /health reports it and clients get it as an
	// error; the other servers are unaffected.
	Problem string
}

// Skipped is a config entry the proxy does not serve, and why.
type Skipped struct {
	Name   string
	Reason string
}

// maxNameLen bounds server names, which appear in URL paths and log names.
const maxNameLen = 64

// LoadConfig reads and validates a server config file. A file with an empty
// "mcpServers" object is valid: the proxy then serves no servers.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading MCP server config: %w", err)
	}
	return parseConfig(data, path, os.LookupEnv)
}

// rawServer is one mcpServers entry as written: Claude Code's fields, and
// the working directory the proxy also takes. Fields the proxy does not use
// (Claude Desktop's and other clients' extras) are ignored.
type rawServer struct {
	mcpconfig.Server
	Cwd string `json:"cwd"`
}

func parseConfig(data []byte, path string, lookupEnv func(string) (string, bool)) (Config, error) {
	fail := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("MCP server config %s: "+format, append([]any{path}, args...)...)
	}
	if !json.Valid(data) {
		var v any
		err := json.Unmarshal(data, &v)
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			line, col := mcpconfig.LineCol(data, syn.Offset)
			return fail("invalid JSON at line %d, column %d: %v (hint: check for a missing comma or quote there)", line, col, syn)
		}
		return fail("invalid JSON: %v", err)
	}
	entries, err := serverEntries(data)
	if err != nil {
		return fail("%v", err)
	}
	cfg := Config{Path: path}
	baseDir := filepath.Dir(path)
	for _, e := range entries {
		if err := validName(e.name); err != nil {
			return fail("server %q: %v", e.name, err)
		}
		var rs rawServer
		if err := json.Unmarshal(e.raw, &rs); err != nil {
			return fail("server %q: %s", e.name, describeJSONError(err))
		}
		if reason := notStdio(rs); reason != "" {
			cfg.Skipped = append(cfg.Skipped, Skipped{Name: e.name, Reason: reason})
			continue
		}
		srv, err := buildServer(e.name, rs, baseDir, lookupEnv)
		if err != nil {
			return fail("server %q: %v", e.name, err)
		}
		cfg.Servers = append(cfg.Servers, srv)
	}
	sort.Slice(cfg.Servers, func(i, j int) bool { return cfg.Servers[i].Name < cfg.Servers[j].Name })
	return cfg, nil
}

type namedRaw struct {
	name string
	raw  json.RawMessage
}

// serverEntries returns the entries of the top-level "mcpServers" object in
// file order, refusing duplicate names (encoding/json would silently keep the
// last one).
func serverEntries(data []byte) ([]namedRaw, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New(`the top level must be a JSON object with an "mcpServers" object in it`)
	}
	found := false
	var entries []namedRaw
	for dec.More() {
		key, err := stringToken(dec)
		if err != nil {
			return nil, err
		}
		if key != "mcpServers" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, err
			}
			continue
		}
		if found {
			return nil, errors.New(`"mcpServers" appears twice`)
		}
		found = true
		if entries, err = objectEntries(dec); err != nil {
			return nil, err
		}
	}
	if !found {
		return nil, errors.New(`no "mcpServers" object (hint: write {"mcpServers": {}} to serve no servers, or {"mcpServers": {"NAME": {"command": "...", "args": [...]}}})`)
	}
	return entries, nil
}

func objectEntries(dec *json.Decoder) ([]namedRaw, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok == nil { // "mcpServers": null
		return nil, nil
	}
	if tok != json.Delim('{') {
		return nil, errors.New(`"mcpServers" must be an object mapping server names to {"command": ..., "args": [...]}`)
	}
	seen := map[string]bool{}
	var entries []namedRaw
	for dec.More() {
		name, err := stringToken(dec)
		if err != nil {
			return nil, err
		}
		if seen[name] {
			return nil, fmt.Errorf("server %q is defined twice (hint: remove or rename one of them)", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		if len(raw) == 0 || raw[0] != '{' {
			return nil, fmt.Errorf(`server %q must be an object like {"command": "...", "args": [...]}`, name)
		}
		entries = append(entries, namedRaw{name, raw})
	}
	_, err = dec.Token() // the closing brace
	return entries, err
}

func stringToken(dec *json.Decoder) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", err
	}
	s, ok := tok.(string)
	if !ok {
		return "", fmt.Errorf("unexpected %v", tok)
	}
	return s, nil
}

// notStdio says why an entry is not a stdio server, or "" when it is one.
func notStdio(rs rawServer) string {
	switch {
	case rs.Type != "" && rs.Type != "stdio":
		return fmt.Sprintf("type %q is not a stdio server; the proxy runs only stdio servers (a remote server can be added to the client directly)", rs.Type)
	case rs.Command == "" && rs.URL != "":
		return "it has a url and no command: a remote server, which the client can use directly"
	}
	return ""
}

func buildServer(name string, rs rawServer, baseDir string, lookupEnv func(string) (string, bool)) (Server, error) {
	if strings.TrimSpace(rs.Command) == "" {
		return Server{}, errors.New(`"command" is missing or empty (hint: name the program to run, e.g. "command": "npx", "args": ["-y", "PACKAGE"])`)
	}
	var missing []string
	exp := func(s string) string {
		out, miss := mcpconfig.Expand(s, lookupEnv)
		missing = append(missing, miss...)
		return out
	}
	srv := Server{Name: name, Command: exp(rs.Command), Dir: exp(rs.Cwd)}
	for _, a := range rs.Args {
		srv.Args = append(srv.Args, exp(a))
	}
	if len(rs.Env) > 0 {
		srv.Env = make(map[string]string, len(rs.Env))
	}
	for k, v := range rs.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return Server{}, fmt.Errorf("env name %q is not a valid environment variable name", k)
		}
		srv.Env[k] = exp(v)
	}
	for _, s := range append([]string{srv.Command, srv.Dir}, srv.Args...) {
		if strings.ContainsRune(s, 0) {
			return Server{}, errors.New("command, args and cwd must not contain NUL characters")
		}
	}
	for _, v := range srv.Env {
		if strings.ContainsRune(v, 0) {
			return Server{}, errors.New("env values must not contain NUL characters")
		}
	}
	if srv.Dir != "" && !filepath.IsAbs(srv.Dir) {
		srv.Dir = filepath.Join(baseDir, srv.Dir)
	}
	if missing = dedupe(missing); len(missing) == 1 {
		srv.Problem = fmt.Sprintf("environment variable %s is not set (hint: set it in the proxy's environment, or write ${%s:-DEFAULT} in the config)", missing[0], missing[0])
	} else if len(missing) > 1 {
		srv.Problem = fmt.Sprintf("environment variables %s are not set (hint: set them in the proxy's environment, or write ${%s:-DEFAULT} in the config)", strings.Join(missing, ", "), missing[0])
	}
	return srv, nil
}

// validName checks a server name, which becomes part of URL paths.
func validName(name string) error {
	const hint = "use letters, digits, '.', '_' or '-', starting with a letter or digit, at most 64 characters; the name is part of the URL /servers/NAME/mcp (hint: rename the entry)"
	if name == "" || len(name) > maxNameLen {
		return errors.New("invalid name: " + hint)
	}
	for i, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			i > 0 && (r == '.' || r == '_' || r == '-')
		if !ok {
			return errors.New("invalid name: " + hint)
		}
	}
	return nil
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		want := map[string]string{"args": "a list of strings", "env": "an object of string values", "command": "a string", "cwd": "a string", "type": "a string", "url": "a string"}
		// Fields of the embedded mcpconfig.Server come as "Server.args".
		field := strings.TrimPrefix(typeErr.Field, "Server.")
		top, _, _ := strings.Cut(field, ".")
		if w, ok := want[top]; ok {
			return fmt.Sprintf("%q must be %s (found a JSON %s)", field, w, typeErr.Value)
		}
		return fmt.Sprintf("%q has the wrong type (found a JSON %s)", field, typeErr.Value)
	}
	return err.Error()
}

func dedupe(ss []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
