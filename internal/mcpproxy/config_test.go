package mcpproxy

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func fakeEnv(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestParseConfig(t *testing.T) {
	env := fakeEnv(map[string]string{"HOME": "/home/dev", "TOKEN": "s3cret", "EMPTY": ""})
	cases := []struct {
		name    string
		json    string
		want    Config
		wantErr string // substring; "" means success
	}{
		{
			name: "claude code .mcp.json with every field",
			json: `{"mcpServers": {
				"fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "${HOME}/work"], "env": {"K": "${TOKEN}", "E": "${EMPTY}"}, "cwd": "sub"},
				"everything": {"type": "stdio", "command": "mcp-server-everything"}
			}}`,
			want: Config{Path: "/w/.mcp.json", Servers: []Server{
				{Name: "everything", Command: "mcp-server-everything"},
				{Name: "fs", Command: "npx", Args: []string{"-y", "@modelcontextprotocol/server-filesystem", "/home/dev/work"},
					Env: map[string]string{"K": "s3cret", "E": ""}, Dir: "/w/sub"},
			}},
		},
		{
			name: "zero servers",
			json: `{"mcpServers": {}}`,
			want: Config{Path: "/w/.mcp.json"},
		},
		{
			name: "claude desktop config with other keys and a remote entry",
			json: `{"globalShortcut": "Ctrl+Space", "mcpServers": {
				"remote": {"type": "http", "url": "https://example.com/mcp"},
				"old-remote": {"url": "https://example.com/sse"},
				"local": {"command": "/usr/bin/srv", "cwd": "/abs", "disabled": false, "alwaysAllow": []}
			}}`,
			want: Config{Path: "/w/.mcp.json",
				Servers: []Server{{Name: "local", Command: "/usr/bin/srv", Dir: "/abs"}},
				Skipped: []Skipped{
					{Name: "remote", Reason: `type "http" is not a stdio server; the proxy runs only stdio servers (a remote server can be added to the client directly)`},
					{Name: "old-remote", Reason: "it has a url and no command: a remote server, which the client can use directly"},
				}},
		},
		{
			name: "defaults and unset variables",
			json: `{"mcpServers": {"a": {"command": "srv", "args": ["${NOPE:-fallback}", "${MISSING}", "${ALSO_MISSING}", "$HOME", "${not valid}"]}}}`,
			want: Config{Path: "/w/.mcp.json", Servers: []Server{{Name: "a", Command: "srv",
				Args:    []string{"fallback", "${MISSING}", "${ALSO_MISSING}", "$HOME", "${not valid}"},
				Problem: "environment variables MISSING, ALSO_MISSING are not set (hint: set them in the proxy's environment, or write ${MISSING:-DEFAULT} in the config)"}}},
		},
		{name: "invalid JSON", json: "{\"mcpServers\": {\n  \"a\": {\"command\": \"x\",}\n}}", wantErr: "invalid JSON at line 2, column 24"},
		{name: "not an object", json: `[1]`, wantErr: `top level must be a JSON object`},
		{name: "no mcpServers", json: `{"servers": {}}`, wantErr: `no "mcpServers" object (hint: write {"mcpServers": {}}`},
		{name: "mcpServers not an object", json: `{"mcpServers": []}`, wantErr: `"mcpServers" must be an object`},
		{name: "duplicate server", json: `{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}`, wantErr: `server "a" is defined twice`},
		{name: "bad name", json: `{"mcpServers": {"my server": {"command": "x"}}}`, wantErr: `server "my server": invalid name: use letters, digits`},
		{name: "name with slash", json: `{"mcpServers": {"a/b": {"command": "x"}}}`, wantErr: `URL /servers/NAME/mcp`},
		{name: "name starting with dot", json: `{"mcpServers": {".a": {"command": "x"}}}`, wantErr: `invalid name`},
		{name: "missing command", json: `{"mcpServers": {"a": {"args": ["x"]}}}`, wantErr: `server "a": "command" is missing or empty (hint:`},
		{name: "args not strings", json: `{"mcpServers": {"a": {"command": "x", "args": [1]}}}`, wantErr: `server "a": "args" must be a list of strings (found a JSON number)`},
		{name: "args a string", json: `{"mcpServers": {"a": {"command": "x", "args": "-y pkg"}}}`, wantErr: `"args" must be a list of strings (found a JSON string)`},
		{name: "env value not string", json: `{"mcpServers": {"a": {"command": "x", "env": {"PORT": 8080}}}}`, wantErr: `must be an object of string values (found a JSON number)`},
		{name: "entry not an object", json: `{"mcpServers": {"a": "npx foo"}}`, wantErr: `server "a" must be an object`},
		{name: "bad env name", json: `{"mcpServers": {"a": {"command": "x", "env": {"A=B": "c"}}}}`, wantErr: `env name "A=B"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseConfig([]byte(c.json), "/w/.mcp.json", env)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, c.wantErr)
				}
				if !strings.HasPrefix(err.Error(), "MCP server config /w/.mcp.json: ") {
					t.Errorf("error %q does not name the file", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestLoadConfigNamesMissingFile(t *testing.T) {
	_, err := LoadConfig(filepath.Join(t.TempDir(), "nope.json"))
	if err == nil || !strings.Contains(err.Error(), "nope.json") {
		t.Fatalf("got %v, want an error naming the file", err)
	}
}

func TestResolveCommand(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "srv")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		srv     Server
		want    string
		wantErr string
	}{
		{srv: Server{Command: "srv", Env: map[string]string{"PATH": "relative:" + dir}}, want: exe},
		{srv: Server{Command: "./srv", Dir: dir}, want: exe},
		{srv: Server{Command: exe}, want: exe},
		{srv: Server{Command: "srv", Env: map[string]string{"PATH": "/nonexistent"}}, wantErr: `command "srv" not found on PATH (hint: install it in the VM`},
		{srv: Server{Command: "npx -y pkg", Env: map[string]string{"PATH": dir}}, wantErr: `put its arguments in "args"`},
		{srv: Server{Command: filepath.Join(dir, "data")}, wantErr: "not executable (hint: chmod +x"},
		{srv: Server{Command: dir}, wantErr: "not a regular file"},
		{srv: Server{Command: "srv", Env: map[string]string{"PATH": "srv"}}, wantErr: "not found on PATH"}, // relative PATH entries are skipped
		{srv: Server{Command: "srv", Problem: "environment variable X is not set"}, wantErr: "environment variable X is not set"},
	}
	for _, c := range cases {
		got, err := resolveCommand(c.srv)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%+v: got %q, %v; want error containing %q", c.srv, got, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%+v: got %q, %v; want %q", c.srv, got, err, c.want)
		}
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // umask-proof
			t.Fatal(err)
		}
		return p
	}
	tok := "0123456789abcdef0123456789abcdef"
	if got, err := ReadToken(write("ok", tok+"\n", 0o600)); err != nil || got != tok {
		t.Errorf("0600 file: got %q, %v", got, err)
	}
	if got, err := ReadToken(write("ro", tok, 0o400)); err != nil || got != tok {
		t.Errorf("0400 file (systemd credentials): got %q, %v", got, err)
	}
	for name, c := range map[string]struct {
		content string
		mode    os.FileMode
		want    string
	}{
		"world-readable": {tok, 0o644, "accessible to other users (mode 0644) (hint: chmod 600"},
		"world-writable": {tok, 0o602, "accessible to other users"},
		"empty":          {"\n", 0o600, "the token is empty (hint:"},
		"short":          {"abc", 0o600, "shorter than 16 characters"},
		"two words":      {tok + " " + tok, 0o600, "one line of visible ASCII"},
	} {
		p := write(name, c.content, c.mode)
		_, err := ReadToken(p)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: got %v, want an error naming %s and containing %q", name, err, p, c.want)
			continue
		}
		if strings.Contains(err.Error(), tok) {
			t.Errorf("%s: error reveals the token", name)
		}
	}
	if _, err := ReadToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file: no error")
	}
}

func TestTokenMatcher(t *testing.T) {
	m := newTokenMatcher("0123456789abcdef")
	for hdr, want := range map[string]bool{
		"Bearer 0123456789abcdef":  true,
		"bearer 0123456789abcdef":  true, // the scheme is case-insensitive (RFC 9110)
		"Bearer 0123456789abcdeF":  false,
		"Bearer 0123456789abcde":   false,
		"Bearer 0123456789abcdef0": false,
		"Basic 0123456789abcdef":   false,
		"0123456789abcdef":         false,
		"":                         false,
	} {
		if got := m.matchAuthorization(hdr); got != want {
			t.Errorf("%q: got %v, want %v", hdr, got, want)
		}
	}
}

func TestNewValidatesOptions(t *testing.T) {
	for name, c := range map[string]struct {
		opts Options
		want string
	}{
		"no token":         {Options{}, "the token is empty"},
		"origin with path": {Options{Token: testToken, AllowedOrigins: []string{"https://a.example/x"}}, `allowed origin "https://a.example/x"`},
		"wildcard origin":  {Options{Token: testToken, AllowedOrigins: []string{"*"}}, `"*" and "null" are not accepted`},
		"health path":      {Options{Token: testToken, HealthPath: "/mcp"}, "collides with an MCP endpoint"},
		"relative health":  {Options{Token: testToken, HealthPath: "health"}, "must be a URL path"},
		"bad server name":  {Options{Token: testToken, Config: Config{Servers: []Server{{Name: "a b", Command: "x"}}}}, `server "a b": invalid name`},
	} {
		if _, err := New(c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, c.want)
		}
	}
}
