package cli

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestCLIKnowsNoBackend keeps the seam: the CLI parses flags and prints,
// and reaches backends, drivers, images and host packages only through vm
// (whose Open is the composition root). Its own (non-test) imports of
// agent-vm's packages are exactly these.
func TestCLIKnowsNoBackend(t *testing.T) {
	const module = "github.com/agent-vm/agent-vm"
	allowed := map[string]bool{
		module + "/internal/vm":             true, // the orchestration
		module + "/internal/vminfo":         true, // what status and list print of a VM, and its states
		module + "/internal/wire":           true, // the composition root, which opens the Manager
		module + "/internal/selfcmd":        true, // the hidden commands agent-vm runs of itself, added to the App
		module + "/internal/cmdline":        true, // what every command keeps: IO, exit codes, usage errors, the logger
		module + "/internal/mcpproxy":       true, // mcp-config's client entries for a VM's agent-mcp
		module + "/internal/termsafe":       true, // a UI helper: escaping untrusted text for the terminal
		module + "/internal/size":           true, // the size grammar --memory, --disk and config.toml's memory share
		module + "/internal/autocheckpoint": true, // the checkpoint schedule's grammar (checkpoint --every, run --checkpoint-every)
		module + "/internal/hostsetup":      true, // setup's and doctor's reports, which the CLI prints
		module + "/internal/pins":           true, // what setup's pins step did to each pin (pins.Kind), which the CLI prints
		module + "/internal/netpolicy":      true, // `net` and `port expose`, given the Manager as their VMs
		module + "/internal/egress":         true, // the net log's entries, the pins' and modes' types, and whether the build has the proxy's test hooks
		module + "/internal/mcpsync":        true, // `mcp sync`, given the Manager as its VMs
		module + "/internal/browser":        true, // `browser` and run --chrome, given the Manager as their VMs
		module + "/internal/template":       true, // the template list's entries
		module + "/internal/agent":          true, // run, attach, sessions, logs --session, given the Manager as their VMs
		module + "/internal/session":        true, // the sessions list's entries
		module + "/internal/forward":        true, // `port add|rm|list`, given the Manager as their VMs
		module + "/internal/fork":           true, // what `fork` made, printed
		module + "/internal/secret":         true, // `secret set|list|rm`, the Manager's store; run's key from the environment
		module + "/internal/hosts":          true, // `host add|list|rm`, the Manager's registry, and host doctor's report
		module + "/internal/top":            true, // `top`, given the Manager as its VMs
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
			t.Errorf("internal/cli imports %s; reach it through internal/vm (opened by internal/wire)", p)
		}
	}
}

// TestCLIImportsNoBackendOrDriver: whatever the list above allows, no
// backend and no driver (a package with a compile-time check of
// backend.Backend or driver.Driver) is among the CLI's imports; internal/wire
// builds them.
func TestCLIImportsNoBackendOrDriver(t *testing.T) {
	const cli = "github.com/agent-vm/agent-vm/internal/cli"
	pkgs := tu.Packages(t)
	backends := tu.Implementing(t, pkgs, "backend", "Backend")
	drivers := tu.Implementing(t, pkgs, "driver", "Driver")
	if len(backends) < 3 || len(drivers) < 2 {
		t.Fatalf("found backends %v and drivers %v: the check proves nothing", backends, drivers)
	}
	i := slices.IndexFunc(pkgs, func(p tu.Package) bool { return p.ImportPath == cli })
	if i < 0 || len(pkgs[i].Imports) == 0 {
		t.Fatalf("go list did not name %s's imports, so the check proves nothing", cli)
	}
	for _, p := range pkgs[i].Imports {
		if backends[p] || drivers[p] {
			t.Errorf("internal/cli imports %s, a backend or driver; internal/wire builds them", p)
		}
	}
}
