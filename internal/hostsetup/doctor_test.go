package hostsetup

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/hostbrowser"
)

// egressCheck judges the package sources' addresses as the egress proxy
// would: a gateway's address that is not globally reachable is reported
// with the way out; public addresses, and a host that resolves nothing
// (offline), are not findings.
func TestEgressCheck(t *testing.T) {
	answer := func(addrs ...string) func(context.Context, string, string) ([]netip.Addr, error) {
		return func(context.Context, string, string) ([]netip.Addr, error) {
			var out []netip.Addr
			for _, a := range addrs {
				out = append(out, netip.MustParseAddr(a))
			}
			return out, nil
		}
	}
	offline := func(context.Context, string, string) ([]netip.Addr, error) { return nil, errors.New("no such host") }
	for _, tc := range []struct {
		name   string
		lookup func(context.Context, string, string) ([]netip.Addr, error)
		ok     bool
		want   []string
	}{
		{"public", answer("151.101.2.132", "2a04:4e42::644"), true, []string{"resolve to addresses the egress proxy reaches"}},
		{"a gateway in TEST-NET-3", answer("203.0.113.80"), false, []string{"deb.debian.org resolves to 203.0.113.80 here, in 203.0.113.0/24", "registry.npmjs.org resolves to 203.0.113.80", "`agent-vm net allow BRANCH ADDRESS`"}},
		{"split DNS to a private proxy", answer("10.20.30.40"), false, []string{"10.20.30.40 here, in 10.0.0.0/8 (private-use)"}},
		{"offline", offline, true, nil},
	} {
		c := egressCheck(context.Background(), tc.lookup)
		text := c.Detail + " " + c.Hint
		if c.Name != "egress" || c.OK != tc.ok {
			t.Errorf("%s: %+v; want check egress with ok %v", tc.name, c, tc.ok)
		}
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: %q lacks %q", tc.name, text, w)
			}
		}
	}
}

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
