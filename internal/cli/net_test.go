package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// The net and port expose commands (and expose, their old name): their refusals, and what they change in a
// (stopped) VM's record and its proxy's policy.
func TestNetCommands(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"create", "x", "--backend", "qemu", "--net", "closed"}, 1, `--net "closed" is not a network mode (hint: one of open, allow, offline)`},
		{[]string{"net", "allow", "--vm", "x"}, 2, "net allow takes DOMAIN..."},
		{[]string{"net", "deny"}, 2, "net deny takes DOMAIN..."},
		{[]string{"net", "mode", "--vm", "x"}, 2, "net mode takes MODE"},
		{[]string{"net", "mode", "--vm", "x", "x", "allow"}, 2, "net mode takes MODE"},
		{[]string{"net", "allow", "--vm", "nope", "example.com"}, 1, "agent-vm list"},
		{[]string{"expose", "--vm", "x"}, 2, "expose takes HOST_PORT"},
		{[]string{"expose", "--vm", "x", "http"}, 2, `HOST_PORT "http" is not a port number`},
		{[]string{"port", "expose", "--vm", "x"}, 2, "port expose takes HOST_PORT"},
		{[]string{"port", "unexpose", "--vm", "x", "1", "2"}, 2, "port unexpose takes HOST_PORT"},
		{[]string{"port", "expose", "--vm", "x", "http"}, 2, `HOST_PORT "http" is not a port number`},
		{[]string{"net-relay"}, 2, ""},
	} {
		r := agentVM(t, repo, st, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-vm %v: exit %d (want %d)\n%s%s", c.args, r.code, c.code, r.stdout, r.stderr)
		}
	}
	// The relay prints nothing, ever: its stderr is the guest's connection.
	if r := agentVM(t, repo, st, "__net-relay", filepath.Join(st, "no.sock")); r.code != 1 || r.stdout+r.stderr != "" {
		t.Errorf("net-relay without a proxy: exit %d, printed %q %q", r.code, r.stdout, r.stderr)
	}

	mustRun(t, repo, st, "create", "x", "--backend", "qemu")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"net", "allow", "--vm", "x", "http://example.com"}, `"http://example.com" is not a domain name`},
		{[]string{"net", "mode", "--vm", "x", "closed"}, `"closed" is not a network mode`},
		{[]string{"expose", "--vm", "x", "3128"}, "the guest reaches the egress proxy"},
		{[]string{"expose", "--vm", "x", "70000"}, "not a port number"},
		{[]string{"expose", "--remove", "--vm", "x", "4599"}, "does not expose host port 4599"},
		{[]string{"port", "expose", "--vm", "x", "3128"}, "the guest reaches the egress proxy"},
		{[]string{"port", "unexpose", "--vm", "x", "4599"}, "does not expose host port 4599"},
	} {
		if r := agentVM(t, repo, st, c.args...); r.code != 1 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-vm %v: exit %d, want 1 and %q\n%s", c.args, r.code, c.want, r.stderr)
		}
	}
	mustRun(t, repo, st, "net", "allow", "--vm", "x", "*.Example.com", "203.0.113.7")
	mustRun(t, repo, st, "net", "deny", "--vm", "x", "registry.npmjs.org")
	mustRun(t, repo, st, "port", "expose", "--vm", "x", "4599")
	r := mustRun(t, repo, st, "net", "show", "--json", "x")
	var info struct {
		Mode    string   `json:"mode"`
		Allow   []string `json:"allow"`
		Deny    []string `json:"deny"`
		Exposed []struct {
			Port int `json:"port"`
		} `json:"exposed"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
		t.Fatal(err)
	}
	if info.Mode != "allow" || !strings.Contains(strings.Join(info.Allow, " "), "*.example.com 203.0.113.7") ||
		len(info.Deny) != 1 || len(info.Exposed) != 1 || info.Exposed[0].Port != 4599 {
		t.Errorf("net show --json: %s", r.stdout)
	}
	// The new guest is set up for the proxy (no reset warning at start).
	if b, err := os.ReadFile(filepath.Join(st, "x", state.RecordFile)); err != nil || !strings.Contains(string(b), `"proxy": true`) {
		t.Errorf("the record does not say the guest is set up for the proxy: %v\n%s", err, b)
	}
	// The proxy's policy file says the same, readable by the user only.
	pol := filepath.Join(st, "x", "net", "policy.json")
	b, err := os.ReadFile(pol)
	if fi, _ := os.Stat(pol); err != nil || fi.Mode().Perm() != 0o600 ||
		!strings.Contains(string(b), `"*.example.com"`) || !strings.Contains(string(b), `"exposed": [`) {
		t.Errorf("policy file: %v\n%s", err, b)
	}
	// status sums it up, and status --json carries it.
	if r := mustRun(t, repo, st, "status", "x"); !strings.Contains(r.stdout,
		"network:    allow-list (the default and *.example.com, 203.0.113.7); refused: registry.npmjs.org; host ports exposed: 4599 (`agent-vm net show x`)") {
		t.Errorf("status does not show the network:\n%s", r.stdout)
	}
	if s := statusJSON(t, st, "x"); s["net"].(map[string]any)["mode"] != "allow" {
		t.Errorf("status --json net: %v", s["net"])
	}
	mustRun(t, repo, st, "net", "mode", "--vm", "x", "offline")
	if r := mustRun(t, repo, st, "status", "x"); !strings.Contains(r.stdout, "network:    offline; refused") {
		t.Errorf("status after net mode offline:\n%s", r.stdout)
	}
	if r := mustRun(t, repo, st, "net", "show", "x"); !strings.Contains(r.stdout, "egress mode offline") {
		t.Errorf("net show after net mode offline:\n%s", r.stdout)
	}
	// create --net sets the VM's mode.
	mustRun(t, repo, st, "create", "y", "--backend", "qemu", "--net", "offline")
	if r := mustRun(t, repo, st, "net", "show", "y"); !strings.Contains(r.stdout, "egress mode offline") {
		t.Errorf("net show of a VM created --net offline:\n%s", r.stdout)
	}
	if r := mustRun(t, repo, st, "net", "log", "--json", "x"); r.stdout != "" {
		t.Errorf("the log of a VM that never ran: %q", r.stdout)
	}
	// unexpose closes the port; the old expose [--remove] still works.
	for _, args := range [][]string{{"port", "unexpose", "--vm", "x", "4599"}, {"expose", "--vm", "x", "4600"}, {"expose", "--remove", "--vm", "x", "4600"}} {
		mustRun(t, repo, st, args...)
	}
	if r := mustRun(t, repo, st, "net", "show", "x"); !strings.Contains(r.stdout, "exposed host ports: none") {
		t.Errorf("net show after unexpose:\n%s", r.stdout)
	}
}

// Started by a root agent-vm for a VM whose QEMU runs as the workspace's
// owner, the proxy drops to that owner before it serves, and still reads
// its policy and writes its log in the network directory, which the owner
// could not reach by path (a 0700 directory of root's above it). It exits
// once its QEMU is gone.
func TestNetProxyDropsToTheOwner(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "dropping privileges needs root")
	top := t.TempDir() // root's, 0700: the owner cannot walk through it
	dir := filepath.Join(top, "net")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := egress.WritePolicy(dir, egress.Policy{Branch: "x", Mode: egress.ModeAllow}); err != nil {
		t.Fatal(err)
	}
	qemu := exec.Command("sleep", "60") // stands for the VM's QEMU
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { qemu.Process.Kill(); qemu.Wait() }()
	pidFile := filepath.Join(top, "qemu.pid")
	os.WriteFile(pidFile, []byte(strconv.Itoa(qemu.Process.Pid)+"\n"), 0o600)
	sock, exposed := filepath.Join(top, "egress.sock"), filepath.Join(top, "exposed.sock")
	var out bytes.Buffer
	proxy := exec.Command(tu.AgentVMBinary(t), "__net-proxy", "--dir", dir, "--proxy-socket", sock, "--exposed-socket", exposed,
		"--qemu-pidfile", pidFile, "--run-as", "65534:65534")
	proxy.Stdout, proxy.Stderr = &out, &out
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- proxy.Wait() }()
	defer proxy.Process.Kill()

	// A denied request through the socket (root may connect to it).
	var resp strings.Builder
	req := strings.NewReader("GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n")
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	var err error
	if perr := tu.Poll(wctx, "the proxy to serve", func() bool {
		resp.Reset()
		err = egress.Relay(context.Background(), sock, 0, req, &resp)
		return err == nil
	}); perr != nil {
		t.Fatalf("%v: %v\n%s", perr, err, out.String())
	}
	if !strings.Contains(resp.String(), "rule: not on the allow-list") {
		t.Errorf("the proxy's answer: %q", resp.String())
	}
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(proxy.Process.Pid) + "/status")
	if !strings.Contains(string(status), "\nUid:\t65534\t65534\t65534\t65534\n") || !strings.Contains(string(status), "\nGid:\t65534\t65534\t65534\t65534\n") ||
		!regexp.MustCompile(`\nGroups:\s*\n`).Match(status) {
		t.Errorf("the proxy is not the owner, without groups:\n%s", status)
	}
	logFile := filepath.Join(dir, egress.LogFile)
	es, err := egress.ReadLog(logFile)
	fi, _ := os.Stat(logFile)
	if err != nil || len(es) != 1 || es[0].Host != "denied.test" || fi == nil || fi.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Errorf("the log: %+v %v %v", es, err, fi)
	}
	// Its QEMU gone, the proxy ends.
	qemu.Process.Kill()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy outlived its QEMU")
	}
	// A root UID or a malformed one is refused.
	for _, bad := range []string{"0:0", "nobody", "-1:5"} {
		r := agentVM(t, "", t.TempDir(), "__net-proxy", "--dir", dir, "--proxy-socket", sock, "--exposed-socket", exposed, "--run-as", bad)
		if r.code != 1 || !strings.Contains(r.stderr, "is not UID:GID") {
			t.Errorf("--run-as %q: exit %d %s", bad, r.code, r.stderr)
		}
	}
}

// TestNetLogLine: an intercepted request's line names the request and the
// secrets put in (names only), and a refusal's error.
func TestNetLogLine(t *testing.T) {
	var b strings.Builder
	at := time.Date(2026, 11, 27, 4, 0, 0, 0, time.Local)
	_ = printNetEntry(&b, egress.LogEntry{Time: at, Kind: "https", Host: "api.github.com", Port: 443, Allowed: true, Rule: "allow api.github.com",
		Request: "POST /repos/o/r/pulls", Secrets: []string{"GH_TOKEN"}}, false)
	_ = printNetEntry(&b, egress.LogEntry{Time: at, Kind: "https", Host: "example.org", Port: 443, Rule: "secret bound elsewhere",
		Request: "GET /x", Error: "placeholder of GH_TOKEN sent to example.org: refused"}, false)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.HasSuffix(lines[0], "  POST /repos/o/r/pulls  secrets: GH_TOKEN") ||
		!strings.Contains(lines[1], "DENIED") || !strings.HasSuffix(lines[1], "GET /x  error: placeholder of GH_TOKEN sent to example.org: refused") {
		t.Errorf("net log lines:\n%s", b.String())
	}
}

// TestNetLogOpenURLLine: a URL the guest asked the host to open is one line
// with the URL the log kept and the verdict, no port and no bytes; the
// guest's text is escaped.
func TestNetLogOpenURLLine(t *testing.T) {
	var b strings.Builder
	at := time.Date(2026, 11, 27, 4, 0, 0, 0, time.Local)
	_ = printNetEntry(&b, egress.LogEntry{Time: at, Kind: egress.KindOpenURL, Host: "example.test", Port: 443, Allowed: true,
		Rule: "opened", URL: "https://example.test/x"}, false)
	_ = printNetEntry(&b, egress.LogEntry{Time: at, Kind: egress.KindOpenURL, Rule: "refused: file: URLs are not opened on the host; only http and https URLs are"}, false)
	_ = printNetEntry(&b, egress.LogEntry{Time: at, Kind: egress.KindOpenURL, Allowed: true, Rule: "printed: opening is off", URL: "https://example.test/\x1b[2J"}, false)
	want := at.Format(time.DateTime) + "  open-url allowed https://example.test/x  (opened)\n" +
		at.Format(time.DateTime) + "  open-url DENIED  -  (refused: file: URLs are not opened on the host; only http and https URLs are)\n" +
		at.Format(time.DateTime) + "  open-url allowed https://example.test/\\x1b[2J  (printed: opening is off)\n"
	if b.String() != want {
		t.Errorf("net log lines:\n%s\nwant:\n%s", b.String(), want)
	}
}

// net allow|deny with a request rule ('METHOD host/path'): a bad one is
// refused with the reason; a good one is in the proxy's policy and in net
// show, before the GitHub defaults an upstream on github.com brings.
func TestNetRequestRules(t *testing.T) {
	repo := tu.Repo(t, false)
	tu.Git(t, repo, "remote", "add", "origin", "git@github.com:o/r.git")
	st := t.TempDir()
	mustRun(t, repo, st, "create", "x", "--backend", "qemu")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"net", "allow", "--vm", "x", "FOO api.github.com/x"}, `request rule "FOO api.github.com/x": "FOO" is not an HTTP method`},
		{[]string{"net", "allow", "--vm", "x", "GET 1.2.3.4/x"}, "is an IP address"},
		{[]string{"net", "deny", "--vm", "x", "POST api.github.com/graphql graphql:x"}, "a deny rule has no graphql condition"},
	} {
		if r := agentVM(t, repo, st, c.args...); r.code != 1 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-vm %q: exit %d, want 1 and %q\n%s", c.args, r.code, c.want, r.stderr)
		}
	}
	r := mustRun(t, repo, st, "net", "allow", "--vm", "x", "POST api.github.com/repos/o/r/pulls/*/merge")
	mustRun(t, repo, st, "net", "deny", "--vm", "x", "post api.github.com/repos/o/r/issues")
	if !strings.Contains(r.stdout, "    allow POST api.github.com/repos/o/r/pulls/*/merge\n") {
		t.Errorf("net allow's output:\n%s", r.stdout)
	}
	r = mustRun(t, repo, st, "net", "show", "x")
	want := "  request rules (the first that matches decides; for the hosts a secret is bound to):\n" +
		"    deny  POST api.github.com/repos/o/r/issues\n" +
		"    allow POST api.github.com/repos/o/r/pulls/*/merge\n" +
		"    allow POST api.github.com/graphql graphql:createPullRequest,addComment  (default)\n"
	if !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "    deny  * api.github.com/**  (default)\n") {
		t.Errorf("net show:\n%s\nwant it to hold\n%s", r.stdout, want)
	}
	r = mustRun(t, repo, st, "net", "show", "--json", "x")
	var info struct {
		Requests []struct {
			Rule    string `json:"rule"`
			Default bool   `json:"default"`
		} `json:"requests"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
		t.Fatal(err)
	}
	if len(info.Requests) != 11 || info.Requests[0].Default || !info.Requests[2].Default || info.Requests[10].Rule != "deny * api.github.com/**" {
		t.Errorf("net show --json: %s", r.stdout)
	}
	b, err := os.ReadFile(filepath.Join(st, "x", "net", "policy.json"))
	if err != nil || !strings.Contains(string(b), `"requests": [
    "deny POST api.github.com/repos/o/r/issues",
    "allow POST api.github.com/repos/o/r/pulls/*/merge",
    "allow POST api.github.com/graphql graphql:createPullRequest,addComment",`) {
		t.Errorf("policy file: %v\n%s", err, b)
	}
}

// net-proxy's TCP front flags, refused as usage errors (exit 2) naming the
// flag before anything listens: --front-exposed (or its old name,
// --front-exposed) or --front-ports without
// --front, --front that is not an address, --front without a ports file,
// and neither sockets nor a front.
func TestNetProxyFrontRefusals(t *testing.T) {
	st, dir := t.TempDir(), t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--front-exposed", "8080"}, "--front-exposed and --front-ports need --front"},
		{[]string{"--front-exposed", "8080"}, "--front-exposed and --front-ports need --front"},
		{[]string{"--front-ports", filepath.Join(dir, "p.json")}, "--front-exposed and --front-ports need --front"},
		{[]string{"--front", "bridge", "--front-ports", filepath.Join(dir, "p.json")}, `--front "bridge" is not an IP address`},
		{[]string{"--front", "127.0.0.1"}, "--front needs --front-ports"},
		{nil, "net-proxy needs --proxy-socket"},
	} {
		r := agentVM(t, "", st, append([]string{"net-proxy", "--dir", dir}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("net-proxy %q: exit %d\n%s\nwant %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("the refusals left %v", ents)
	}
}

// net-forward's refusals are usage errors (exit 2) naming what is wrong,
// before anything listens (a partial set of --via flags names the ones
// missing); a port another program holds, and a link whose key cannot be
// read, are errors naming them.
func TestNetForwardRefusals(t *testing.T) {
	st := t.TempDir()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	hp := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "net-forward needs at least one --forward PORT=HOST:PORT or --return-socket SOCKET=PORT"},
		{[]string{"--return-socket", "rel/sock=8080"}, 2, `--return-socket "rel/sock=8080" is not SOCKET=PORT`},
		{[]string{"--return-socket", "/run/x/8080=0"}, 2, `--return-socket "/run/x/8080=0" is not SOCKET=PORT`},
		{[]string{"--return-socket", "/run/x/8080=8080"}, 2, "--return-socket needs the --via flags"},
		{[]string{"--forward", "2222"}, 2, `forward "2222" is not PORT=HOST:PORT`},
		{[]string{"--forward", "2222=10.0.0.2:22", "--run-as", "0:0"}, 2, `--run-as "0:0" is not UID:GID of a user other than root`},
		{[]string{"--forward", hp + "=10.0.0.2:22"}, 1, "listening on 127.0.0.1:" + hp},
		{[]string{"--forward", "2222=10.0.0.2:22", "--via-addr", "big:22"}, 2,
			"--via-addr needs --via-user, --via-key, --via-known-hosts too"},
		{[]string{"--forward", "2222=10.0.0.2:22", "--via-key", "k", "--via-known-hosts", "kh"}, 2,
			"--via-key, --via-known-hosts needs --via-addr, --via-user too"},
		{[]string{"--forward", "2222=10.0.0.2:22", "--via-addr", "big", "--via-user", "u", "--via-key", "k", "--via-known-hosts", "kh"}, 2,
			`--via-addr "big" is not HOST:PORT`},
		{[]string{"--forward", hp + "=10.0.0.2:22", "--via-addr", "big:22", "--via-user", "u", "--via-key", filepath.Join(st, "no.key"), "--via-known-hosts", "kh"}, 1,
			"preparing the link to big:22: reading key " + filepath.Join(st, "no.key")},
	} {
		r := agentVM(t, "", st, append([]string{"net-forward"}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("net-forward %q: exit %d\n%s\nwant %d, %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
}

// net-forward --via-addr for real: started as root with agent-vm's key for
// the host in a directory only root reaches, it listens, drops to another
// user, and carries a connection to 127.0.0.1:PORT through the SSH link
// to what the host reaches (an echo server), which it cannot reach while
// the host's sshd is stopped; once the sshd is back it makes the link
// again, reading no file.
func TestNetForwardViaLink(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "dropping privileges needs root")
	srv := sshdtest.New(t)
	srv.Start()
	echoL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echoL.Close()
	go func() {
		for {
			c, err := echoL.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	top := t.TempDir() // root's, 0700
	key, pin := filepath.Join(top, "host.key"), filepath.Join(top, "known_hosts")
	for from, to := range map[string]string{srv.KeyFile: key, srv.KnownHosts: pin} {
		b, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(to, b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	var out bytes.Buffer
	fwd := exec.Command(tu.AgentVMBinary(t), "net-forward", "--forward", port+"="+echoL.Addr().String(),
		"--via-addr", srv.Addr, "--via-user", srv.User, "--via-key", key, "--via-known-hosts", pin,
		"--run-as", "65534:65534", "--tag", "via-test")
	fwd.Stdout, fwd.Stderr = &out, &out
	if err := fwd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { fwd.Process.Kill(); fwd.Wait() }()

	echo := func(line string) error {
		var c net.Conn
		var err error
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if perr := tu.Poll(ctx, "the exposed port to accept", func() bool { c, err = net.Dial("tcp", "127.0.0.1:"+port); return err == nil }); perr != nil {
			return fmt.Errorf("%w: %w", perr, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, line); err != nil {
			return err
		}
		got := make([]byte, len(line))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if string(got) != line {
			return fmt.Errorf("echoed %q, want %q", got, line)
		}
		return nil
	}
	if err := echo("through the link"); err != nil {
		t.Fatalf("a connection through net-forward --via-addr: %v\n%s", err, out.String())
	}
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(fwd.Process.Pid) + "/status")
	if !strings.Contains(string(status), "\nUid:\t65534\t65534\t65534\t65534\n") {
		t.Errorf("net-forward did not drop to 65534:\n%s", status)
	}
	// With the host's sshd gone the destination is out of reach (it is
	// reached through the link, not from here), and back with it.
	srv.Stop()
	if err := echo("no link"); err == nil {
		t.Errorf("a connection was carried with the host's sshd stopped: not through the link")
	}
	srv.Start()
	if err := echo("through the link made again"); err != nil {
		t.Errorf("after the host's sshd restarted: %v\n%s", err, out.String())
	}
}

// The shipped build (no agentvm_testhooks tag, as `go test` builds this
// package) has no proxy test hooks: net-proxy ignores their variables,
// saying so, and `version` does not claim them. The tests' own agent-vm
// (tu.AgentVMBinary) has them and says so.
func TestShippedBuildHasNoTestHooks(t *testing.T) {
	if egress.TestHooks {
		// Skip, not SkipOrFail: nothing is missing here; the build this
		// test is about is the other one.
		t.Skip("built with -tags agentvm_testhooks: this test is about the build without")
	}
	dir := t.TempDir()
	r := agentVMEnv(t, "", t.TempDir(), map[string]string{egress.TestHostsEnv: "github.com=198.18.0.9", egress.TestRootCAEnv: "/tmp/ca.pem"},
		"__net-proxy", "--dir", dir, "--proxy-socket", filepath.Join(dir, "p.sock"), "--exposed-socket", filepath.Join(dir, "d.sock"), "--run-as", "0:0")
	for _, v := range []string{egress.TestHostsEnv, egress.TestRootCAEnv} {
		if !strings.Contains(r.stderr, "ignored: this agent-vm is built without the proxy's test hooks") || !strings.Contains(r.stderr, v) {
			t.Errorf("net-proxy with %s set: stderr %q; want it named as ignored", v, r.stderr)
		}
	}
	if r := mustRun(t, "", t.TempDir(), "version"); strings.Contains(r.stdout, "testhooks") {
		t.Errorf("version %q claims the test hooks", r.stdout)
	}
	out, err := exec.Command(tu.AgentVMBinary(t), "version").Output()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), " +testhooks") {
		t.Errorf("the tests' agent-vm: version %q, %v; want it to end in +testhooks", out, err)
	}
}

// A DevTools call the DevTools relay refused is one line: the method, the
// URL it would have loaded (as the log keeps it) and the reason.
func TestNetLogDevToolsLine(t *testing.T) {
	var b strings.Builder
	at := time.Date(2026, 11, 29, 4, 0, 0, 0, time.Local)
	_ = printNetEntry(&b, egress.LogEntry{Time: at, Kind: egress.KindDevTools, Request: "Page.navigate", URL: "file:///etc/passwd",
		Rule: "the host's browser loads http, https and about:blank only"}, false)
	_ = printNetEntry(&b, egress.LogEntry{Time: at, Kind: egress.KindDevTools, Request: "Browser.close\x1b[2J", Rule: "it closes the host's browser"}, false)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.HasSuffix(lines[0], "devtools DENIED  Page.navigate file:///etc/passwd  (the host's browser loads http, https and about:blank only)") ||
		strings.Contains(lines[1], "\x1b") || !strings.Contains(lines[1], "(it closes the host's browser)") {
		t.Errorf("net log lines:\n%q", lines)
	}
}

// The spellings that led with BRANCH before --vm still work, each with a
// note on stderr naming the new spelling.
func TestOldVMSpellings(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	if r := agentVM(t, repo, st, "create", "--branch", "x", "--backend", "qemu"); r.code != 0 || !strings.Contains(r.stderr, "--branch is deprecated; write create x") {
		t.Fatalf("create --branch x: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"net", "allow", "x", "example.com", "example.org"}, "net allow --vm x ..."},
		{[]string{"net", "deny", "x", "example.net"}, "net deny --vm x ..."},
		{[]string{"net", "mode", "x", "offline"}, "net mode --vm x ..."},
		{[]string{"port", "add", "x", "3000"}, "port add --vm x ..."},
		{[]string{"port", "add", "x", "3001", "39001"}, "port add --vm x ..."},
		{[]string{"port", "rm", "x", "3001"}, "port rm --vm x ..."},
		{[]string{"port", "expose", "x", "4599"}, "port expose --vm x ..."},
		{[]string{"port", "unexpose", "x", "4599"}, "port unexpose --vm x ..."},
	} {
		r := agentVM(t, repo, st, c.args...)
		if r.code != 0 || !strings.Contains(r.stderr, "is deprecated; write "+c.want) {
			t.Errorf("agent-vm %v: exit %d, want 0 and a note naming %q\n%s%s", c.args, r.code, c.want, r.stdout, r.stderr)
		}
	}
	// A first word that names no VM is a DOMAIN of the checked-out branch's VM.
	if r := agentVM(t, repo, st, "net", "allow", "example.com", "example.org"); r.code != 1 || !strings.Contains(r.stderr, `no VM for branch "main"`) || strings.Contains(r.stderr, "deprecated") {
		t.Errorf("net allow example.com example.org (no VM for main): exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r := mustRun(t, repo, st, "net", "show", "x", "--json")
	for _, w := range []string{"example.com", "example.org", "example.net", "offline"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("net show x lacks %q after the old spellings:\n%s", w, r.stdout)
		}
	}
	if fwds := portList(t, st, "x"); len(fwds) != 1 || fwds[0].Guest != 3000 {
		t.Errorf("forwards after the old spellings: %v", fwds)
	}
}
