package repoconfig

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A policy file's entries come out checked and written as `net allow|deny`
// keeps them, with the file's hash.
func TestParsePolicy(t *testing.T) {
	src := "# policy\nallow = [\n  \"PyPI.org.\",\n  '*.pythonhosted.org',\n]\ndeny = [\"telemetry.example.com\"]\n" +
		"requests = [\"allow put api.github.com/repos/o/r/pulls/*/merge\", \"deny POST api.github.com/repos/o/r/issues\"]\n"
	p, err := ParsePolicy("main:.agent-vm/policy.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Allow, []string{"pypi.org", "*.pythonhosted.org"}) || !slices.Equal(p.Deny, []string{"telemetry.example.com"}) {
		t.Errorf("allow %q, deny %q", p.Allow, p.Deny)
	}
	if !slices.Equal(p.Requests, []string{"allow PUT api.github.com/repos/o/r/pulls/*/merge", "deny POST api.github.com/repos/o/r/issues"}) {
		t.Errorf("requests %q", p.Requests)
	}
	if len(p.Sum) != 64 || p.Path != "main:.agent-vm/policy.toml" {
		t.Errorf("sum %q, path %q", p.Sum, p.Path)
	}
	if p.Secrets != nil || p.MCP != nil {
		t.Errorf("a file without [secrets] or mcp: %v, %v", p.Secrets, p.MCP)
	}
	// [secrets] and mcp: host names in their canonical form; an empty mcp
	// list is a list (bring in none), not its absence.
	p, err = ParsePolicy("p.toml", []byte("mcp = []\n[secrets]\nGH_TOKEN = [\"API.GitHub.com.\"]\nNPM_TOKEN = []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.MCP == nil || len(*p.MCP) != 0 || !slices.Equal(p.Secrets["GH_TOKEN"], []string{"api.github.com"}) || p.Secrets["NPM_TOKEN"] == nil && len(p.Secrets) != 2 {
		t.Errorf("mcp %v, secrets %v", p.MCP, p.Secrets)
	}
}

// Bad input is refused with the file, the line and what is wrong.
func TestParsePolicyRefusesBadInput(t *testing.T) {
	many := "allow = [" + strings.Repeat(`"a.example",`, MaxPolicyEntries+1) + "]\n"
	for _, tc := range []struct{ name, src, want string }{
		{"syntax", "allow = [\"a.example\"\ndeny = []\n", "p.toml:2: "},
		{"unknown key", "# p\n\nmode = \"open\"\n", `p.toml:3: unknown key "mode"`},
		{"wrong type", "\nallow = \"a.example\"\n", "p.toml:2: "},
		{"bad host in a multi-line list", "allow = [\n  \"a.example\",\n  \"http://b.example/x\",\n]\n", `p.toml:3: "http://b.example/x" is not a domain name`},
		{"bad deny", "deny = [\"*\"]\n", `p.toml:1: "*" is not a domain name`},
		{"bad rule", "\n\nrequests = [\"allow FETCH a.example/x\"]\n", `p.toml:3: request rule "FETCH a.example/x"`},
		{"rule without a verdict", "requests = [\"GET a.example/x\"]\n", `p.toml:1: "GET a.example/x" is not a request rule`},
		{"too many", many, "entries are more than 200"},
		{"bad secret name", "[secrets]\n\"GH-TOKEN\" = [\"api.github.com\"]\n", `p.toml:2: [secrets] secret name "GH-TOKEN" is not an environment variable name`},
		{"secret host a pattern", "[secrets]\nGH_TOKEN = [\n  \"api.github.com\",\n  \"*.github.com\",\n]\n", `p.toml:4: [secrets] GH_TOKEN: secret host "*.github.com" is not a DNS name`},
		{"secret hosts a string", "[secrets]\nGH_TOKEN = \"api.github.com\"\n", "p.toml:2: "},
		{"bad mcp name", "mcp = [\"github\", \"a b\"]\n", `p.toml:1: "a b" is not an MCP server's name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePolicy("p.toml", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// A workspace without the file has no policy; a link in its place is
// refused, not followed.
func TestLoadPolicy(t *testing.T) {
	ws := t.TempDir()
	if p, err := LoadPolicy(ws, "x"); p != nil || err != nil {
		t.Errorf("no file: %+v, %v", p, err)
	}
	os.MkdirAll(filepath.Join(ws, ".agent-vm"), 0o755)
	target := filepath.Join(t.TempDir(), "elsewhere.toml")
	os.WriteFile(target, []byte("allow = [\"a.example\"]\n"), 0o644)
	os.Symlink(target, filepath.Join(ws, PolicyFile))
	if _, err := LoadPolicy(ws, "main:"+PolicyFile); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("a link: %v, want it refused", err)
	}
	os.Remove(filepath.Join(ws, PolicyFile))
	os.WriteFile(filepath.Join(ws, PolicyFile), []byte("deny = [\"b.example\"]\n"), 0o644)
	if p, err := LoadPolicy(ws, "main:"+PolicyFile); err != nil || !slices.Equal(p.Deny, []string{"b.example"}) {
		t.Errorf("the file: %+v, %v", p, err)
	}
}
