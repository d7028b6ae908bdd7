package cli

import (
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// hostHome makes a HOME whose ~/.claude.json has MCP servers with secrets,
// and returns it with the checksum of that file.
func hostHome(t *testing.T, doc string) (string, [32]byte) {
	t.Helper()
	home := t.TempDir()
	path := filepath.Join(home, ".claude.json")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return home, sha256.Sum256([]byte(doc))
}

const hostClaudeJSON = `{
  "mcpServers": {
    "gh": {"command": "npx", "args": ["-y", "gh-mcp"], "env": {"TOKEN": "canary-literal-3141"}},
    "db": {"type": "http", "url": "http://localhost:5432/mcp", "headers": {"Authorization": "Bearer ${DB_TOKEN}"}}
  }
}
`

func TestMCPSyncDryRunWritesNothingAndShowsNoValues(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "m", "--backend", "qemu")
	home, sum := hostHome(t, hostClaudeJSON)
	record := filepath.Join(st, "m", "config.json")
	before, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HOME": home, "DB_TOKEN": "canary-env-2718"}
	for _, args := range [][]string{{"mcp", "sync", "--dry-run", "m"}, {"mcp", "sync", "--dry-run", "--json", "m"}} {
		r := agentVMEnv(t, repo, st, env, args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
		}
		for _, canary := range []string{"canary-literal-3141", "canary-env-2718"} {
			if strings.Contains(r.stdout+r.stderr, canary) {
				t.Errorf("%v printed the value %s:\n%s", args, canary, r.stdout)
			}
		}
		for _, want := range []string{"${AGENT_VM_MCP_GH_ENV_TOKEN}", "10.0.2.100:5432", "AGENT_VM_MCP_DB_HEADER_AUTHORIZATION"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("%v lacks %q:\n%s", args, want, r.stdout)
			}
		}
	}
	r := agentVMEnv(t, repo, st, env, "mcp", "sync", "--dry-run", "--json", "m")
	var res struct {
		Written bool `json:"written"`
		Exposed []struct {
			Port int `json:"port"`
		} `json:"exposed"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("%v:\n%s", err, r.stdout)
	}
	if res.Written || len(res.Exposed) != 1 || res.Exposed[0].Port != 5432 {
		t.Errorf("dry run result: %+v", res)
	}
	after, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) {
		t.Errorf("a dry run changed the record:\n%s", after)
	}
	if got, err := os.ReadFile(filepath.Join(home, ".claude.json")); err != nil || sha256.Sum256(got) != sum {
		t.Errorf("the host's ~/.claude.json changed (err %v)", err)
	}
}

func TestMCPSyncFailures(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "m", "--backend", "qemu")
	good, sum := hostHome(t, hostClaudeJSON)
	bad, _ := hostHome(t, "{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"npx\"}\n    \"b\": {}\n  }\n}\n")
	for _, tc := range []struct {
		name string
		home string
		args []string
		want []string
	}{
		{"malformed host file", bad, []string{"mcp", "sync", "--dry-run", "m"}, []string{filepath.Join(bad, ".claude.json") + ":4:5:", "not valid JSON"}},
		{"stopped VM", good, []string{"mcp", "sync", "m"}, []string{`"m" is stopped`, "agent-vm start m", "--dry-run"}},
		{"unknown VM", good, []string{"mcp", "sync", "nope"}, []string{"nope"}},
		{"two branches", good, []string{"mcp", "sync", "a", "b"}, []string{"at most one BRANCH"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := agentVMEnv(t, repo, st, map[string]string{"HOME": tc.home}, tc.args...)
			if r.code == 0 {
				t.Fatalf("exit 0:\n%s", r.stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
	if got, err := os.ReadFile(filepath.Join(good, ".claude.json")); err != nil || sha256.Sum256(got) != sum {
		t.Errorf("the host's ~/.claude.json changed (err %v)", err)
	}
}
