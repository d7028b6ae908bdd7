package egress

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

// A pin lets its address through for its name alone: another allowed name
// that resolves to the same address is refused with its reason (a 403 the
// log keeps), and no pin lets one of the host's own addresses through.
func TestPinIsForItsNameAlone(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "mirror for %s", r.Host) }))
	defer srv.Close()
	p := port(t, srv.URL)
	pol := Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"registry.npmjs.org", "registry.yarnpkg.com"},
		Pins: []Pin{{Name: "registry.npmjs.org", Addr: loopback}}}
	f := newFixture(t, pol)
	f.pretendOwn() // the loopback is judged by its block: not globally reachable
	f.resolveTo("registry.npmjs.org", loopback)
	f.resolveTo("registry.yarnpkg.com", loopback)

	if code, body := f.get("http://REGISTRY.npmjs.org.:" + p + "/"); code != http.StatusOK || body != "mirror for REGISTRY.npmjs.org.:"+p {
		t.Errorf("the pinned name: %d %q; want the server's answer", code, body)
	}
	code, body := f.get("http://registry.yarnpkg.com:" + p + "/")
	why := "registry.yarnpkg.com resolves to 127.0.0.1, in 127.0.0.0/8 (loopback), which is not globally reachable"
	if code != http.StatusForbidden || !strings.Contains(body, why) || !strings.Contains(body, "agent-vm net allow --vm feat 127.0.0.1") || strings.Contains(body, "agent-vm setup") {
		t.Errorf("another name at the pinned address: %d %q; want 403 saying %q, with net allow as the fix (it is no package source)", code, body, why)
	}
	// An allowed request is logged once its answer is passed back: the
	// two entries may be in either order.
	es := f.entries(2)
	byHost := map[string]LogEntry{}
	for _, e := range es {
		byHost[e.Host] = e
	}
	if npm, yarn := byHost["registry.npmjs.org"], byHost["registry.yarnpkg.com"]; len(es) != 2 || !npm.Allowed || yarn.Allowed || yarn.Rule != RuleAddresses {
		t.Errorf("log = %+v; want the pinned name allowed, the other refused for its address", es)
	}

	f.pretendOwn(loopback)
	code, body = f.get("http://registry.npmjs.org:" + p + "/")
	if code != http.StatusForbidden || !strings.Contains(body, "registry.npmjs.org resolves to 127.0.0.1, an address of this host") ||
		!strings.Contains(body, "(an address of this host: the VM then reaches the host's own services there)") || strings.Contains(body, "agent-vm setup") {
		t.Errorf("a pin to an address of this host: %d %q; want 403, with net allow alone as the fix", code, body)
	}
}

// A name that is a package source, refused for its address, is answered
// with setup as the first fix: it pins the address for that name.
func TestRefusedPackageSourceNamesSetup(t *testing.T) {
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"registry.npmjs.org"}})
	f.pretendOwn()
	f.resolveTo("registry.npmjs.org", netip.MustParseAddr("203.0.113.80"))
	resp, err := f.client().Get("http://registry.npmjs.org/left-pad")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "agent-vm: connection to registry.npmjs.org:80 refused by this VM's network policy: the name is allowed, but registry.npmjs.org resolves to 203.0.113.80, in 203.0.113.0/24 (documentation, TEST-NET-3), which is not globally reachable."
	if resp.StatusCode != http.StatusForbidden || !strings.HasPrefix(string(b), want+"\n") || resp.Header.Get("X-Agent-VM-Denied") != want ||
		!strings.Contains(string(b), "on the host with: agent-vm setup (it pins registry.npmjs.org to the address this host's resolver gives it, for every VM and for that name alone), or agent-vm net allow --vm feat 203.0.113.80") {
		t.Errorf("%d %q (header %q); want 403 starting %q, setup then net allow as fixes", resp.StatusCode, b, resp.Header.Get("X-Agent-VM-Denied"), want)
	}
}

// Against a host outside this one, at an address that is not globally
// reachable (198.18.0.0/15): the pinned name reaches it, over TLS the
// client checks; another allowed name of the same server is refused for
// the address, and the server hears nothing of it.
func TestPinReachesAnOutsideHost(t *testing.T) {
	u := testutil.NewUpstream(t, testutil.UpstreamOptions{Names: []string{"registry.npmjs.org", "registry.yarnpkg.com"}})
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"registry.npmjs.org", "registry.yarnpkg.com"},
		Pins: []Pin{{Name: "registry.npmjs.org", Addr: u.Addr}}})
	f.p.InterfaceAddrs = nil // the host's real addresses
	f.resolveTo("registry.npmjs.org", u.Addr)
	f.resolveTo("registry.yarnpkg.com", u.Addr)
	f.dialOnly(u)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(f.url), TLSClientConfig: &tls.Config{RootCAs: u.CertPool()}}}
	resp, err := c.Get("https://registry.npmjs.org/left-pad")
	if err != nil {
		t.Fatalf("the pinned name: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "upstream: GET registry.npmjs.org/left-pad\n" {
		t.Errorf("the pinned name: %d %q", resp.StatusCode, b)
	}
	_, err = c.Get("https://registry.yarnpkg.com/left-pad")
	if err == nil || !strings.Contains(err.Error(), "Forbidden by agent-vm") {
		t.Errorf("another name of the server: %v; want the proxy's 403", err)
	}
	c.CloseIdleConnections()
	es := f.entries(2)
	var refused LogEntry
	for _, e := range es {
		if e.Host == "registry.yarnpkg.com" {
			refused = e
		}
	}
	if len(es) != 2 || refused.Allowed || refused.Rule != RuleAddresses || len(refused.Refused) != 1 ||
		refused.Refused[0] != (Refusal{Addr: u.Addr, Why: "in 198.18.0.0/15 (benchmarking), which is not globally reachable"}) {
		t.Errorf("log = %+v; want registry.yarnpkg.com refused for its benchmarking address", es)
	}
	if got := u.Requests(); len(got) != 1 || got[0].Host != "registry.npmjs.org" {
		t.Errorf("the upstream got %+v; want the pinned name's request alone", got)
	}
}

// A real npm, asked to install through the proxy from a registry whose
// address the proxy refuses, fails on the proxy's 403 (E403) and does
// not retry it: it makes as many connections with npm's default retries
// (2) as with none. A 502, which npm retries after 10 s and more, would
// make three times as many. (Here npm 11.19.1 and 9.2.0 fail in 1.5 s and
// 3 s; against a 502 both took 71 s.)
func TestNPMDoesNotRetryARefusal(t *testing.T) {
	npm := testutil.Program(t, "npm")
	connections := func(retries string) int {
		f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"registry.npmjs.org"}})
		f.resolveTo("registry.npmjs.org", netip.MustParseAddr("203.0.113.80"))
		home := t.TempDir()
		proxy := f.url.String()
		cmd := exec.Command(npm, "install", "--prefix", filepath.Join(home, "p"), "--cache", filepath.Join(home, "cache"),
			"--userconfig", filepath.Join(home, "npmrc"), "--proxy", proxy, "--https-proxy", proxy, "--noproxy", "",
			"--registry", "https://registry.npmjs.org/", "--fetch-retries", retries, "--no-audit", "--no-fund", "left-pad")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "E403") || !strings.Contains(string(out), "Forbidden by agent-vm") {
			t.Fatalf("npm install with %s retries: %v\n%s\nwant it to fail on the proxy's 403", retries, err, out)
		}
		es, err := ReadLog(filepath.Join(f.dir, LogFile))
		if err != nil || len(es) == 0 {
			t.Fatalf("the log: %v, %v", es, err)
		}
		for _, e := range es {
			if e.Allowed || e.Rule != RuleAddresses {
				t.Errorf("npm's connection %+v was not refused for its address", e)
			}
		}
		return len(es)
	}
	if none, two := connections("0"), connections("2"); none != two {
		t.Errorf("npm made %d connections with no retries and %d with two: it retried the 403", none, two)
	}
}
