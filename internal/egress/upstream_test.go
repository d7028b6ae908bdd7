package egress

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/credswap"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

const (
	outsideToken       = "ghp_outside_token_5b7e1c"
	outsidePlaceholder = "agent-vm-placeholder-fedcba9876543210"
)

// outsideFixture is the real proxy in front of u, a host outside this
// one (testutil.NewUpstream: a network namespace of its own): its names
// upstream.test and other.test both lead to u's address, which the policy
// allows itself, as a non-global address must be. GH_TOKEN is bound to
// upstream.test and OTHER_TOKEN to other.test, so the proxy intercepts
// both; it trusts u's CA. The proxy dials u's HTTPS port and nothing
// else. The client trusts the VM's CA alone, as the guest does.
func outsideFixture(t *testing.T, u *testutil.Upstream) (*fixture, *http.Client, *CA) {
	t.Helper()
	f := newFixture(t, Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"upstream.test", "other.test", u.Addr.String()}})
	f.p.Hosts["upstream.test"], f.p.Hosts["other.test"] = u.Addr, u.Addr
	f.dialOnly(u)
	set, err := credswap.New([]credswap.Secret{
		{Name: "GH_TOKEN", Placeholder: outsidePlaceholder, Value: outsideToken, Hosts: []string{"upstream.test"}},
		{Name: "OTHER_TOKEN", Placeholder: "agent-vm-placeholder-0123456789abcdef", Value: "other_real_value_33a1", Hosts: []string{"other.test"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	vmCA := testCA(t, "feat")
	f.p.Intercept = NewInterceptor(vmCA, set, "feat", "")
	f.p.Intercept.RootCAs = u.CertPool()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(f.url),
		TLSClientConfig: &tls.Config{RootCAs: pool(vmCA)}}}
	return f, c, vmCA
}

// dialOnly lets the proxy dial u's HTTPS port and nothing else.
func (f *fixture) dialOnly(u *testutil.Upstream) {
	https := netip.AddrPortFrom(u.Addr, 443).String()
	f.p.dialContext = func(ctx context.Context, network, address string) (net.Conn, error) {
		if address != https {
			f.t.Errorf("the proxy dialed %s, not the upstream", address)
			return nil, fmt.Errorf("the test refuses to dial %s", address)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
}

// Against a host outside this one: the placeholder sent to the name its
// secret is bound to arrives as the secret; sent to another allowed name
// of the same server, it is refused and nothing arrives. Without the
// address on the allow-list the proxy does not connect at all: it is not
// globally reachable.
func TestInterceptToAnOutsideHost(t *testing.T) {
	u := testutil.NewUpstream(t, testutil.UpstreamOptions{})
	f, c, _ := outsideFixture(t, u)
	get := func(url string) (int, string, error) {
		req, err := http.NewRequest("GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+outsidePlaceholder)
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}

	if code, body, err := get("https://upstream.test/v1/models"); err != nil || code != 200 || body != "upstream: GET upstream.test/v1/models\n" {
		t.Fatalf("the bound name: %d %q %v", code, body, err)
	}
	got := u.Requests()
	if len(got) != 1 || got[0].Host != "upstream.test" || !got[0].TLS || got[0].Header.Get("Authorization") != "Bearer "+outsideToken {
		t.Fatalf("the upstream got %+v, want one request to upstream.test with the secret", got)
	}

	code, body, err := get("https://other.test/v1/models")
	if err != nil || code != http.StatusForbidden || !strings.Contains(body, `carries the placeholder of secret "GH_TOKEN", which may only be sent to upstream.test`) {
		t.Errorf("another name: %d %q %v, want 403 naming the secret", code, body, err)
	}
	if got := u.Requests(); len(got) != 1 {
		t.Errorf("the upstream got %d requests, want the first alone: %+v", len(got), got)
	}
	// An allowed request is logged once its answer is passed back: the
	// two entries may be in either order.
	es := f.entries(2)
	byHost := map[string]LogEntry{}
	for _, e := range es {
		byHost[e.Host] = e
	}
	if up, other := byHost["upstream.test"], byHost["other.test"]; len(es) != 2 || !up.Allowed || fmt.Sprint(up.Secrets) != "[GH_TOKEN]" ||
		other.Allowed || other.Kind != "https" || len(other.Secrets) != 0 {
		t.Errorf("log = %+v, want the bound request allowed with GH_TOKEN and the other refused", es)
	}

	f.setPolicy(Policy{Branch: "feat", Mode: ModeAllow, Allow: []string{"upstream.test", "other.test"}})
	c.CloseIdleConnections() // the policy is applied to each tunnel as it opens
	if _, _, err := get("https://upstream.test/v1/again"); err == nil {
		t.Errorf("the upstream's address, no longer allowed itself, was reached")
	}
	es = f.entries(3)
	want := "in 198.18.0.0/15 (benchmarking), which is not globally reachable"
	if len(es) != 3 || es[2].Rule != RuleAddresses || len(es[2].Refused) != 1 || es[2].Refused[0].Addr != u.Addr || es[2].Refused[0].Why != want {
		t.Errorf("log = %+v, want the last refusing %s: %q", es, u.Addr, want)
	}
	if got := u.Requests(); len(got) != 1 {
		t.Errorf("the upstream got %d requests, want the first alone", len(got))
	}
}

// A real git push to a host outside this one, through the proxy: the
// guest holds the placeholder as its password, the host asks for the real
// token (401 otherwise), and the VM's branch lands.
func TestPushToAnOutsideHost(t *testing.T) {
	u := testutil.NewUpstream(t, testutil.UpstreamOptions{Password: outsideToken})
	f, _, vmCA := outsideFixture(t, u)
	dir := testutil.Repo(t, false)
	bare, path := u.BareRepo(t, "project")
	caFile := filepath.Join(t.TempDir(), "vm-ca.pem")
	testutil.WriteFile(t, caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: vmCA.Certificate().Raw})))

	cmd := exec.Command("git", "-C", dir, "-c", "http.proxy="+f.url.String(), "push",
		"https://x-access-token:"+outsidePlaceholder+"@upstream.test"+path, "HEAD:feat")
	// The guest's environment alone: its VM's CA, no other proxy.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Dir(dir), "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C",
		"GIT_TERMINAL_PROMPT=0", "GIT_SSL_CAINFO=" + caFile}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git push: %v\n%s", err, out)
	}
	if got, want := testutil.Git(t, bare, "rev-parse", "refs/heads/feat"), testutil.Git(t, dir, "rev-parse", "HEAD"); got != want {
		t.Errorf("feat is %s on the upstream, want %s", got, want)
	}
	var withToken int
	for _, r := range u.Requests() {
		if _, pass, ok := (&http.Request{Header: r.Header}).BasicAuth(); ok && pass != outsideToken {
			t.Errorf("the upstream got a password other than the token: %s %s", r.Method, r.Path)
		} else if ok {
			withToken++
		}
	}
	if withToken < 2 { // the push's info/refs and its POST
		t.Errorf("the upstream got %d requests with the token, want 2 or more", withToken)
	}
}
