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
	} {
		if !strings.Contains(nix, want) {
			t.Errorf("modules/guest.nix lacks %s", want)
		}
	}
}
