//go:build nixpkgs

package nixos

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEvaluateWithRealNixpkgs is opt-in, built only with the nixpkgs tag: it
// needs a nixpkgs checkout (AGENT_VM_TEST_NIXPKGS=/path/to/nixpkgs, release
// 26.05) and a nix that can evaluate it (2.18+), which the machines
// agent-vm's CI runs on do not have:
//
//	AGENT_VM_TEST_NIXPKGS=/path/to/nixpkgs go test -tags nixpkgs ./internal/nixos
//
// It renders a branch's files, evaluates the VM with the real modules, and
// checks what the build would carry: the loopback-only forwards in the run
// script, the virtiofs workspace mount, and the credential channel for the
// host key. (The launcher's own QEMU arguments are golden-tested in
// internal/qemu.)
func TestEvaluateWithRealNixpkgs(t *testing.T) {
	nixpkgs := os.Getenv("AGENT_VM_TEST_NIXPKGS")
	if nixpkgs == "" {
		t.Fatal("set AGENT_VM_TEST_NIXPKGS to a nixpkgs 26.05 checkout (and use nix >= 2.18)")
	}
	l, r := testVM(t, "feature/x", "k")
	v, err := newVMJSON(l, r, nixpkgs, "virtiofs", "")
	if err != nil {
		t.Fatal(err)
	}
	// The real binary would be copied into the store; any static file will do.
	exe := staticBinary(t)
	v.AgentVMExecutable = &exe
	if err := writeFiles(l.Dir, v); err != nil {
		t.Fatal(err)
	}
	eval := func(expr string) string {
		t.Helper()
		cmd := exec.Command("nix-instantiate", "--eval", "--strict", "--json", "--expr",
			"let d = import "+filepath.Join(l.Dir, "default.nix")+"; n = import ("+nixpkgs+" + \"/nixos/lib/eval-config.nix\") { system = \""+v.System+"\"; modules = [ "+filepath.Join(l.Dir, "modules", "guest.nix")+" (import "+filepath.Join(l.Dir, "data.nix")+").guest ]; }; in "+expr)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("evaluating %s: %v\n%s", expr, err, out)
		}
		return string(out)
	}
	if drv := eval("d.vm.drvPath"); !strings.Contains(drv, ".drv") {
		t.Fatalf("vm.drvPath: %s", drv)
	}
	script := eval("n.config.system.build.vm.text or (builtins.readFile \"${n.config.system.build.vm}/bin/run-feature-x-vm\")")
	for _, want := range []string{"hostfwd=tcp:127.0.0.1:2222-:22", "hostfwd=tcp:127.0.0.1:8001-:8000"} {
		if !strings.Contains(script, want) {
			t.Errorf("run script lacks %s", want)
		}
	}
	if fs := eval(`n.config.fileSystems."/workspace".fsType`); fs != `"virtiofs"` {
		t.Errorf("workspace fsType %s", fs)
	}
	if creds := eval("n.config.systemd.services.agent-vm-secrets.serviceConfig.ImportCredential"); !strings.Contains(creds, "agent-vm.ssh-host-key") {
		t.Errorf("host key credential not imported: %s", creds)
	}
}
