package guest

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// The NixOS guest module spells the contract in Nix; it must say what this
// package says.
func TestGuestModuleAgrees(t *testing.T) {
	raw, err := os.ReadFile("../../modules/guest.nix")
	if err != nil {
		t.Fatal(err)
	}
	nix := string(raw)
	for _, want := range []string{
		fmt.Sprintf("userName = %q;", User),
		fmt.Sprintf("hostKeyCredential = %q;", HostKeyCredential),
		fmt.Sprintf("tokenCredential = %q;", MCPTokenCredential),
		fmt.Sprintf("device = %q;", ShareTag),
		fmt.Sprintf("tag = %q;", ShareTag),
		fmt.Sprintf("default = %q;", Workspace),
		fmt.Sprintf("port = lib.mkDefault %d;", MCPPort),
		fmt.Sprintf("default = lib.mkDefault %q;", ProxyURL),
		fmt.Sprintf("noProxy = lib.mkDefault %q;", NoProxy),
	} {
		if !strings.Contains(nix, want) {
			t.Errorf("modules/guest.nix lacks %s", want)
		}
	}
	for _, f := range GuidanceFiles {
		if !strings.Contains(nix, fmt.Sprintf("%q", f)) {
			t.Errorf("modules/guest.nix does not link the guidance note to %s", f)
		}
	}
}

func TestGuidanceSaysWhereTheAgentIs(t *testing.T) {
	g := Guidance(GuidanceInfo{Branch: "feature/x", Repo: "/home/me/project", SSHPort: 2222, MCPPort: 8001,
		Install: "Install packages with `sudo apt-get install NAME`."})
	for _, want := range []string{"`feature/x`", "/home/me/project", "/workspace", "user dev, with passwordless sudo",
		"sudo apt-get install NAME", "host port\n  2222", "host port 8001, guest port 8000", "`agent-vm port add feature/x PORT`", "0.0.0.0", "do not push unless they ask",
		"only through agent-vm's proxy", "ports the\n  user exposed to this VM, at 10.0.2.100"} {
		if !strings.Contains(g, want) {
			t.Errorf("guidance lacks %q:\n%s", want, g)
		}
	}
}

// Both guests run modules/provision.sh, and guest.nix guards its unit with
// the status file: they must use the contract's paths.
func TestProvisionFilesAgree(t *testing.T) {
	script, err := os.ReadFile("../../modules/provision.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"workspace=" + Workspace + "\n", "script=$workspace/" + ProvisionScript + "\n",
		"log=" + ProvisionLog + "\n", "status=" + ProvisionStatus + "\n"} {
		if !strings.Contains(string(script), want) {
			t.Errorf("modules/provision.sh lacks %q", want)
		}
	}
	nix, err := os.ReadFile("../../modules/guest.nix")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`ConditionPathExists = "!%s";`, ProvisionStatus); !strings.Contains(string(nix), want) {
		t.Errorf("modules/guest.nix lacks %s", want)
	}
}
