package mcpconfig_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/mcpconfig"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// hostEnv is the host's environment in these tests.
var hostEnv = map[string]string{"DB_TOKEN": "db-secret", "GH_TOKEN": "gh-secret", "DOCS_TOKEN": "docs-secret"}

func lookup(name string) (string, bool) { v, ok := hostEnv[name]; return v, ok }

func options() mcpconfig.Options {
	return mcpconfig.Options{Lookup: lookup, Home: "/home/me", Workspace: "/workspace", HostAddr: "10.0.2.2",
		Programs: []string{"git", "node", "npm", "npx", "python3", "sh"}}
}

func fixture() mcpconfig.HostFiles {
	return mcpconfig.HostFiles{ClaudeJSON: "testdata/host/claude.json", Project: "/src/repo", MCPJSON: "testdata/host/mcp.json"}
}

func load(t *testing.T, f mcpconfig.HostFiles) mcpconfig.Host {
	t.Helper()
	h, err := mcpconfig.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestConvertGolden covers every kind of server at once: stdio through npx,
// uvx, an absolute host path and a project path; HTTP and SSE on the
// loopback (IPv4, IPv6, localhost); a remote one; env and header values,
// literal and ${VAR}; scopes shadowing each other; two servers whose
// variable names collide.
func TestConvertGolden(t *testing.T) {
	p := mcpconfig.Convert(load(t, fixture()), options())
	type env struct{ Name, Value string }
	var envs []env
	for _, e := range p.Env {
		envs = append(envs, env{e.Name, e.Value})
	}
	out, err := json.MarshalIndent(struct {
		Servers map[string]mcpconfig.Server
		Reports []mcpconfig.Report
		Env     []env
		Exposed []mcpconfig.Exposed
	}{p.Servers, p.Reports, envs, p.Exposed}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, "testdata/convert.golden", append(out, '\n'))
}

func TestNoValueInGuestConfig(t *testing.T) {
	p := mcpconfig.Convert(load(t, fixture()), options())
	b, err := json.Marshal(p.Servers)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"ghp_LITERAL_SECRET", "db-secret", "gh-secret", "docs-secret", "first", "second"} {
		if strings.Contains(string(b), secret) {
			t.Errorf("guest config holds the value %q:\n%s", secret, b)
		}
	}
	if len(p.Env) == 0 {
		t.Fatal("no variables to pass")
	}
	for _, e := range p.Env {
		if !strings.HasPrefix(e.Name, mcpconfig.VarPrefix) {
			t.Errorf("variable %s lacks the prefix %s", e.Name, mcpconfig.VarPrefix)
		}
		if s := e.String(); strings.Contains(s, e.Value) && e.Value != "" {
			t.Errorf("EnvVar.String() shows the value: %s", s)
		}
	}
}

func TestCollisionsGetDistinctNames(t *testing.T) {
	p := mcpconfig.Convert(load(t, fixture()), options())
	seen := map[string]bool{}
	for _, e := range p.Env {
		if seen[e.Name] {
			t.Errorf("variable %s is passed twice", e.Name)
		}
		seen[e.Name] = true
	}
	a, b := p.Servers["a-b"].Env["TOKEN"], p.Servers["a_b"].Env["TOKEN"]
	if a == b {
		t.Errorf("servers a-b and a_b both reference %s", a)
	}
}

func TestExposedPorts(t *testing.T) {
	p := mcpconfig.Convert(load(t, fixture()), options())
	var got []int
	for _, e := range p.Exposed {
		got = append(got, e.Port)
	}
	// db is the project's (6543, over the user's 5432); events 9000; helper 7000.
	want := []int{6543, 7000, 9000}
	if len(got) != len(want) {
		t.Fatalf("exposed %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("exposed %v, want %v", got, want)
		}
	}
}

func TestMalformedNamesFileAndLine(t *testing.T) {
	f := mcpconfig.HostFiles{ClaudeJSON: "testdata/malformed/claude.json", Project: "/src/repo"}
	_, err := mcpconfig.Load(f)
	if err == nil {
		t.Fatal("a malformed file loaded")
	}
	if want := "testdata/malformed/claude.json:4:5:"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %q, want it to start with %q", err, want)
	}
}

func TestTypeErrorNamesLine(t *testing.T) {
	f := mcpconfig.HostFiles{ClaudeJSON: filepath.Join(t.TempDir(), "claude.json")}
	write(t, f.ClaudeJSON, "{\n  \"mcpServers\": []\n}\n")
	_, err := mcpconfig.Load(f)
	if err == nil || !strings.Contains(err.Error(), "claude.json:2:") {
		t.Errorf("got %v, want an error at line 2", err)
	}
}

func TestMissingFilesHoldNoServers(t *testing.T) {
	dir := t.TempDir()
	h := load(t, mcpconfig.Locate(func(string) string { return "" }, dir, filepath.Join(dir, "repo")))
	if len(h.Servers) != 0 {
		t.Errorf("got %d servers from no files", len(h.Servers))
	}
}

func TestClaudeConfigDir(t *testing.T) {
	getenv := func(k string) string {
		if k == mcpconfig.ConfigDirEnv {
			return "testdata/configdir"
		}
		return ""
	}
	f := mcpconfig.Locate(getenv, "/home/nobody", "/src/repo")
	if f.ClaudeJSON != "testdata/configdir/.claude.json" {
		t.Fatalf("ClaudeJSON = %q", f.ClaudeJSON)
	}
	f.MCPJSON = ""
	h := load(t, f)
	if len(h.Servers) != 1 || h.Servers[0].Name != "from-config-dir" {
		t.Fatalf("servers %+v", h.Servers)
	}
	if def := mcpconfig.Locate(func(string) string { return "" }, "/home/me", ""); def.ClaudeJSON != "/home/me/.claude.json" || def.MCPJSON != "" {
		t.Errorf("default: %+v", def)
	}
}

func TestMergeKeepsTheRest(t *testing.T) {
	p := mcpconfig.Convert(load(t, fixture()), options())
	cur := read(t, "testdata/guest-current.json")
	out, err := mcpconfig.Merge(cur, "/home/dev/.claude.json", "/workspace", p.Servers, []string{"removed-on-host", "github"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, "testdata/merge.golden", out)
}

func TestMergeRefusesABrokenGuestFile(t *testing.T) {
	_, err := mcpconfig.Merge([]byte("{\n\"projects\": 3,\n"), "/home/dev/.claude.json", "/workspace", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "/home/dev/.claude.json:") {
		t.Errorf("got %v", err)
	}
}

func TestMergeIntoNothing(t *testing.T) {
	out, err := mcpconfig.Merge(nil, "x", "/workspace", map[string]mcpconfig.Server{"s": {Command: "npx"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	frag, err := mcpconfig.Fragment("/workspace", map[string]mcpconfig.Server{"s": {Command: "npx"}})
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != string(frag) {
		t.Errorf("merge into nothing:\n%s\nfragment:\n%s", out, frag)
	}
}

func TestExpand(t *testing.T) {
	env := func(k string) (string, bool) { v, ok := map[string]string{"A": "1", "E": ""}[k]; return v, ok }
	for _, tc := range []struct{ in, want, missing string }{
		{"${A}", "1", ""},
		{"x${A}y${A}", "x1y1", ""},
		{"${B:-def}", "def", ""},
		{"${E:-def}", "", ""},
		{"${B}", "${B}", "B"},
		{"$A", "$A", ""},
		{"${1A}", "${1A}", ""},
		{"${A", "${A", ""},
	} {
		got, missing := mcpconfig.Expand(tc.in, env)
		if got != tc.want || strings.Join(missing, ",") != tc.missing {
			t.Errorf("Expand(%q) = %q, %v; want %q, %q", tc.in, got, missing, tc.want, tc.missing)
		}
	}
}

// Only (the repository's policy's mcp) keeps the servers it names and
// skips the others, saying why; it brings in none the host lacks.
func TestOnlyTheRepositorysServers(t *testing.T) {
	o := options()
	only := []string{"a-b", "not-on-the-host"}
	o.Only = &only
	p := mcpconfig.Convert(load(t, fixture()), o)
	if len(p.Servers) != 1 || p.Servers["a-b"].Command == "" && p.Servers["a-b"].URL == "" {
		t.Errorf("servers: %v", p.Servers)
	}
	skipped := 0
	for _, r := range p.Reports {
		if r.Name != "a-b" && r.Action == mcpconfig.ActionSkipped && strings.Contains(r.Detail, "policy") {
			skipped++
		}
		if r.Name == "not-on-the-host" {
			t.Errorf("a server the host lacks is reported: %+v", r)
		}
	}
	if skipped == 0 {
		t.Errorf("no server skipped for the policy: %+v", p.Reports)
	}
	none := []string{}
	o.Only = &none
	if p := mcpconfig.Convert(load(t, fixture()), o); len(p.Servers) != 0 || len(p.Env) != 0 {
		t.Errorf("mcp = [] brought in %v", p.Servers)
	}
}
