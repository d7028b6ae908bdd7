package scenario

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/integration/harness"
)

// syncCanary is a secret in the host's Claude Code configuration: mcp sync
// must not put it on the guest's disk, nor print it.
const syncCanary = "itest-mcp-sync-canary-5b1f"

// checkMCPSync gives the VM a host Claude Code configuration (through
// CLAUDE_CONFIG_DIR) with a stdio server holding a secret and an HTTP server
// on the host's loopback, runs `mcp sync`, and reads the guest's file back:
// the servers are in the local scope of /workspace, with references and the
// host's address, mode 0600 and owned by the guest user; the host's file is
// unchanged.
func checkMCPSync(ctx context.Context, s *harness.S) error {
	dir, err := s.TempDir("claude-config-")
	if err != nil {
		return err
	}
	host := filepath.Join(dir, ".claude.json")
	doc := `{"mcpServers": {
  "itest-secret": {"command": "npx", "args": ["-y", "some-mcp"], "env": {"API_KEY": "` + syncCanary + `"}},
  "itest-http": {"type": "http", "url": "http://127.0.0.1:4599/mcp"}}}
`
	if err := os.WriteFile(host, []byte(doc), 0o600); err != nil {
		return err
	}
	res := s.Call(ctx, harness.Call{Args: []string{"mcp", "sync", "--json", mcpBranch}, Env: []string{"CLAUDE_CONFIG_DIR=" + dir}})
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	if strings.Contains(res.Stdout+res.Stderr, syncCanary) {
		return harness.Failf(res, "mcp sync printed the secret value")
	}
	var out struct {
		Written bool `json:"written"`
		Exposed []struct {
			Port int `json:"port"`
		} `json:"exposed"`
		Vars     []string `json:"vars"`
		AgentMCP []struct {
			Name string `json:"name"`
		} `json:"agent_mcp"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil {
		return harness.Failf(res, "mcp sync --json: %v", err)
	}
	if !out.Written || len(out.Exposed) != 1 || out.Exposed[0].Port != 4599 || len(out.Vars) != 1 {
		return harness.Failf(res, "mcp sync --json: written %v, exposed %v, vars %v; want written, port 4599, one variable", out.Written, out.Exposed, out.Vars)
	}
	if len(out.AgentMCP) != 1 || out.AgentMCP[0].Name != "itest" {
		return harness.Failf(res, "mcp sync --json lists agent-mcp's servers as %v, want the workspace's one, itest", out.AgentMCP)
	}
	if b, err := os.ReadFile(host); err != nil || sha256.Sum256(b) != sha256.Sum256([]byte(doc)) {
		return fmt.Errorf("mcp sync changed the host's %s (err %v)", host, err)
	}
	got, err := s.ExecOK(ctx, mcpBranch, "sh", "-c", `stat -c '%a %U' ~/.claude.json && cat ~/.claude.json`)
	if err != nil {
		return err
	}
	meta, body, _ := strings.Cut(got.Stdout, "\n")
	if meta != "600 dev" {
		return harness.Failf(got, "the guest's ~/.claude.json is %q, want mode 600 and owner dev", meta)
	}
	if strings.Contains(body, syncCanary) {
		return harness.Failf(got, "the guest's ~/.claude.json holds the secret value")
	}
	var guest struct {
		Projects map[string]struct {
			MCPServers map[string]struct {
				URL string            `json:"url"`
				Env map[string]string `json:"env"`
			} `json:"mcpServers"`
		} `json:"projects"`
	}
	if err := json.Unmarshal([]byte(body), &guest); err != nil {
		return harness.Failf(got, "the guest's ~/.claude.json: %v", err)
	}
	servers := guest.Projects["/workspace"].MCPServers
	if u := servers["itest-http"].URL; u != "http://10.0.2.100:4599/mcp" {
		return harness.Failf(got, "itest-http's URL in the guest is %q, want http://10.0.2.100:4599/mcp", u)
	}
	if v := servers["itest-secret"].Env["API_KEY"]; v != "${"+out.Vars[0]+"}" {
		return harness.Failf(got, "itest-secret's API_KEY in the guest is %q, want ${%s}", v, out.Vars[0])
	}
	if _, ok := servers["itest"]; !ok {
		return harness.Failf(got, "the project's server (its .mcp.json) is not in the guest's local scope")
	}
	return nil
}
