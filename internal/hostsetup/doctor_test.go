package hostsetup

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/hostbrowser"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
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

// doctor's account line: made (its ids), not yet (what makes it), or
// why it cannot serve (an account of that name with root's ids).
func TestAccountCheck(t *testing.T) {
	root := t.TempDir()
	h := hostpkgs.Host{Root: root}
	if c := accountCheck(h); !c.OK || !strings.Contains(c.Detail, "not made yet") {
		t.Errorf("no account: %+v", c)
	}
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("agent-vm:x:59999:59998::/nonexistent:/usr/sbin/nologin\n"), 0o644)
	if c := accountCheck(h); !c.OK || !strings.HasPrefix(c.Detail, "uid 59999, gid 59998") {
		t.Errorf("the account: %+v", c)
	}
	os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("agent-vm:x:0:0::/:/bin/sh\n"), 0o644)
	if c := accountCheck(h); c.OK || !strings.Contains(c.Detail, "userdel agent-vm") {
		t.Errorf("root's ids: %+v", c)
	}
}
