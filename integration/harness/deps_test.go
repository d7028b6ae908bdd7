package harness

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoInternalImports enforces the rule that the integration test drives
// agent-vm only through its command line: neither the harness, the
// scenarios, the binary nor their tests, nor blackbox (what they share with
// bench/), may depend, even indirectly, on agent-vm's internal packages.
func TestNoInternalImports(t *testing.T) {
	const module = "github.com/agent-vm/agent-vm"
	pkgs := []string{module + "/integration/harness", module + "/integration/scenario", module + "/integration/portcheck", module + "/cmd/integration-test", module + "/blackbox"}
	out, err := exec.Command("go", append([]string{"list", "-deps", "-test"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	listed := map[string]bool{}
	for _, d := range deps {
		listed[d] = true
		if d == module+"/internal" || strings.HasPrefix(d, module+"/internal/") {
			t.Errorf("the integration test (or blackbox) depends on %s; it may use agent-vm only through its command line", d)
		}
	}
	for _, p := range pkgs {
		if !listed[p] {
			t.Fatalf("go list -deps did not list %s itself, so its answer proves nothing:\n%s", p, out)
		}
	}
}
