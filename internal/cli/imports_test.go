package cli

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCLIKnowsNoBackend keeps the seam: the CLI parses flags and prints,
// and reaches backends, drivers, images and host packages only through vm
// (whose Open is the composition root). Its own (non-test) imports of
// agent-vm's packages are exactly these.
func TestCLIKnowsNoBackend(t *testing.T) {
	const module = "github.com/agent-vm/agent-vm"
	allowed := map[string]bool{
		module + "/internal/vm":          true, // the orchestration
		module + "/internal/mcpproxy":    true, // agent-mcp, which `mcp-proxy` runs in the guest
		module + "/internal/termsafe":    true, // a UI helper: escaping untrusted text for the terminal
		module + "/internal/size":        true, // the size grammar --memory, --disk and config.toml's memory share
		module + "/internal/personalize": true, // guest-personalize, which runs in a restored guest
	}
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, module+"/internal/cli").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	imports := strings.Fields(string(out))
	if len(imports) == 0 {
		t.Fatalf("go list named no imports, so its answer proves nothing:\n%s", out)
	}
	for _, p := range imports {
		if strings.HasPrefix(p, module+"/") && !allowed[p] {
			t.Errorf("internal/cli imports %s; reach it through internal/vm (see vm.Open)", p)
		}
	}
}
