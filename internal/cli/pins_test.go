package cli

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/pins"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// setup's pins, end to end: the built agent-vm runs where this host's
// resolver (a private /etc/hosts, read by the binary's own Go resolver)
// answers npm's registry and a second allowed name with the address of a
// server outside this host, in 198.18.0.0/15 (not globally reachable),
// Debian's mirror with a gateway's address, and Debian's security mirror
// with an address of this host. setup --no-pins says what it found and
// records nothing; setup pins npm's registry and the mirror (not the
// address of this host, and says why), and run again changes nothing;
// doctor and net show list the pins. Then the VM's real egress proxy,
// under the same resolver, reaches the server for npm's registry, over
// TLS the client checks, and refuses the second name at the same
// address, with the reason.
func TestSetupPinsThePackageSourcesForTheProxy(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "mount and network namespaces need root")
	u := tu.NewUpstream(t, tu.UpstreamOptions{Names: []string{"registry.npmjs.org", "registry.yarnpkg.com"}})
	gateway, self := netip.MustParseAddr("203.0.113.80"), netip.MustParseAddr("127.0.0.1")
	hosts := map[string]netip.Addr{"registry.npmjs.org": u.Addr, "registry.yarnpkg.com": u.Addr, "deb.debian.org": gateway, "security.debian.org": self}
	bin := tu.AgentVMBinary(t)
	aptDir, _ := fakeAptPath(t, false)
	config, st, home := t.TempDir(), t.TempDir(), t.TempDir()
	pinsFile := filepath.Join(config, "agent-vm", pins.FileName)
	env := []string{"PATH=" + aptDir, "HOME=" + home, "XDG_CONFIG_HOME=" + config, "NO_COLOR=1"}
	run := func(args ...string) string {
		t.Helper()
		argv := tu.InHosts(t, hosts, append([]string{bin, "--state-dir", st}, args...)...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env, cmd.Stdin = env, nil
		out, _ := cmd.CombinedOutput() // setup then fails: the fake apt has no packages, and there is no consent
		return string(out)
	}
	npm := fmt.Sprintf("registry.npmjs.org → %s (in 198.18.0.0/15 (benchmarking), which is not globally reachable", u.Addr)

	out := run("setup", "--no-pins")
	for _, want := range []string{"found: " + npm + "; not pinned: --no-pins)",
		"found: deb.debian.org → 203.0.113.80 (in 203.0.113.0/24 (documentation, TEST-NET-3)",
		"not pinned: security.debian.org → 127.0.0.1 (an address of this host: a pin never lets a VM reach this host itself; should security.debian.org's mirror be this host, `agent-vm net allow --vm BRANCH 127.0.0.1` lets one VM reach it there)",
		"nothing recorded (--no-pins)", "`agent-vm net allow --vm BRANCH ADDRESS`"} {
		if !strings.Contains(out, want) {
			t.Errorf("setup --no-pins lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(pinsFile); err == nil || strings.Contains(out, "\npinned: ") {
		t.Fatalf("setup --no-pins pinned: %v\n%s", err, out)
	}

	out = run("setup")
	want := []egress.Pin{{Name: "deb.debian.org", Addr: gateway}, {Name: "registry.npmjs.org", Addr: u.Addr}}
	var got struct {
		Pins []egress.Pin `json:"pins"`
	}
	b, err := os.ReadFile(pinsFile)
	if err == nil {
		err = json.Unmarshal(b, &got)
	}
	if err != nil || !reflect.DeepEqual(got.Pins, want) || !strings.Contains(out, "pinned: "+npm+": taken as this network's gateway or mirror") ||
		!strings.Contains(out, "not pinned: security.debian.org → 127.0.0.1") {
		t.Fatalf("setup: pins %v, %v; want %v\n%s", got.Pins, err, want, out)
	}
	if fi, err := os.Stat(pinsFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the pins file: %v, %v; want 0600", fi, err)
	}
	if out = run("setup"); strings.Contains(out, "\npinned: ") || !strings.Contains(out, "pinned already: 2") {
		t.Errorf("setup again:\n%s", out)
	}

	out = run("doctor")
	for _, want := range []string{"--  egress", "security.debian.org resolves to 127.0.0.1 here, an address of this host", "an address of this host is never pinned",
		"pins (" + pinsFile + ", by `agent-vm setup`)", "    " + u.Addr.String() + " for registry.npmjs.org\n", "    203.0.113.80 for deb.debian.org\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor lacks %q:\n%s", want, out)
		}
	}

	// A VM's policy carries the pins; net show lists them.
	repo := tu.Repo(t, false)
	cfg := map[string]string{"XDG_CONFIG_HOME": config}
	if r := agentVMEnv(t, repo, st, cfg, "create", "x", "--backend", "qemu"); r.code != 0 {
		t.Fatalf("create: %d %s", r.code, r.stderr)
	}
	if r := agentVMEnv(t, repo, st, cfg, "net", "allow", "--vm", "x", "registry.yarnpkg.com"); r.code != 0 ||
		!strings.Contains(r.stdout, "  pinned:  "+u.Addr.String()+" for registry.npmjs.org (the host's pins, every VM's: `agent-vm setup`)") {
		t.Errorf("net allow: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r := agentVMEnv(t, repo, st, cfg, "net", "show", "--json", "x")
	var info struct {
		Pins []egress.Pin `json:"pins"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || !reflect.DeepEqual(info.Pins, want) {
		t.Errorf("net show --json: %v\n%s", err, r.stdout)
	}

	// The VM's proxy, under the same resolver.
	netDir := filepath.Join(st, "x", "net")
	sock := filepath.Join(t.TempDir(), "egress.sock")
	argv := tu.InHosts(t, hosts, bin, "net-proxy", "--dir", netDir, "--proxy-socket", sock, "--exposed-socket", sock+".exposed")
	proxy := exec.Command(argv[0], argv[1:]...)
	var proxyOut strings.Builder
	proxy.Stdout, proxy.Stderr = &proxyOut, &proxyOut
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Process.Kill(); proxy.Wait() })
	get := func(host string) (int, string) {
		t.Helper()
		var c net.Conn
		var err error
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if perr := tu.Poll(ctx, "the proxy to listen", func() bool { c, err = net.Dial("unix", sock); return err == nil }); perr != nil {
			t.Fatalf("%v: %v\n%s", perr, err, proxyOut.String())
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(c, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", host, host)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatalf("CONNECT %s: %v", host, err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: u.CertPool()})
		req, _ := http.NewRequestWithContext(context.Background(), "GET", "https://"+host+"/left-pad", nil)
		if err := req.Write(tc); err != nil {
			t.Fatalf("GET through the tunnel to %s: %v", host, err)
		}
		resp, err = http.ReadResponse(bufio.NewReader(tc), req)
		if err != nil {
			t.Fatalf("GET through the tunnel to %s: %v", host, err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("registry.npmjs.org"); code != 200 || body != "upstream: GET registry.npmjs.org/left-pad\n" {
		t.Errorf("the pinned name: %d %q\n%s", code, body, proxyOut.String())
	}
	why := fmt.Sprintf("registry.yarnpkg.com resolves to %s, in 198.18.0.0/15 (benchmarking), which is not globally reachable", u.Addr)
	if code, body := get("registry.yarnpkg.com"); code != http.StatusForbidden || !strings.Contains(body, why) {
		t.Errorf("another allowed name at the pinned address: %d %q; want 403 saying %q", code, body, why)
	}
	if got := u.Requests(); len(got) != 1 || got[0].Host != "registry.npmjs.org" {
		t.Errorf("the upstream got %+v; want the pinned name's request alone", got)
	}
}
