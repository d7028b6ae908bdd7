package hostsetup

import (
	"slices"
	"testing"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/hostbrowser"
)

// The browser's facts become doctor's checks, each found or why not.
func TestBrowserReport(t *testing.T) {
	r := browserReport(hostbrowser.Facts{Bridge: "/tmp/claude-mcp-browser-bridge-me/1.sock", Binary: "/usr/bin/chromium", Version: "Chromium 156",
		DevToolsProblem: "nothing answers on 127.0.0.1:9222: start Chrome", Chrome: hostbrowser.ViaBridge})
	want := []Check{
		{Name: "claude in chrome bridge", OK: true, Detail: "/tmp/claude-mcp-browser-bridge-me/1.sock"},
		{Name: "chrome/chromium", OK: true, Detail: "/usr/bin/chromium (Chromium 156)"},
		{Name: "devtools 127.0.0.1:9222", Detail: "nothing answers on 127.0.0.1:9222: start Chrome"},
	}
	if r.Chrome != hostbrowser.ViaBridge || !slices.Equal(r.Checks, want) {
		t.Errorf("got %+v, want %+v", r, want)
	}
	r = browserReport(hostbrowser.Facts{BridgeProblem: "no socket", BinaryProblem: "no Chrome", DevTools: &bridge.DevTools{Browser: "Chrome/141"}, Chrome: hostbrowser.ViaDevTools})
	if r.Checks[0].OK || r.Checks[0].Detail != "no socket" || r.Checks[1].OK || r.Checks[1].Detail != "no Chrome" || !r.Checks[2].OK || r.Checks[2].Detail != "Chrome/141 answers" {
		t.Errorf("got %+v", r)
	}
}
