package netpolicy

import (
	"os"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/state"
)

// net show and status say which browser bridges a VM has open, and that
// none is by default.
func TestInfoShowsTheBrowserBridges(t *testing.T) {
	vms := newFakeVMs(t, &state.Record{})
	if info := InfoOf(vms.e, true, nil); len(info.Browser) != 0 {
		t.Fatalf("no bridge open, yet net show says %q", info.Browser)
	}
	if err := os.MkdirAll(vms.e.Layout.RunDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := bridge.WriteConfig(vms.e.Layout.RunDir(), bridge.Config{DevTools: "127.0.0.1:9222"}); err != nil {
		t.Fatal(err)
	}
	info := InfoOf(vms.e, true, nil)
	if len(info.Browser) != 1 || !strings.Contains(info.Browser[0], "host Chrome reachable (CDP") {
		t.Fatalf("net show's browser: %q", info.Browser)
	}
}
