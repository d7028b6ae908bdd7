package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
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
		{[]string{"create", "x", "--backend", "qemu", "--net", "closed"}, 1, `--net "closed" is not a network mode (hint: one of open, allow, ask, offline)`},
		{[]string{"net", "approve", "--vm", "x"}, 2, "net approve takes ID..."},
		{[]string{"net", "approve", "--vm", "x", "example.com"}, 2, `net approve takes ask IDs, numbers as agent-vm net pending lists them, got ["example.com"]`},
		{[]string{"net", "deny", "--vm", "x", "--always", "example.com"}, 2, "net deny --always is for ask IDs"},
		{[]string{"net", "pending", "x", "y"}, 2, "takes at most one BRANCH"},
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
	} {
		r := agentVM(t, repo, st, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-vm %v: exit %d (want %d)\n%s%s", c.args, r.code, c.code, r.stdout, r.stderr)
		}
	}

	mustRun(t, repo, st, "create", "x", "--backend", "qemu")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"net", "allow", "--vm", "x", "http://example.com"}, `"http://example.com" is not a domain name`},
		{[]string{"net", "mode", "--vm", "x", "closed"}, `"closed" is not a network mode`},
		{[]string{"net", "mode", "--vm", "x", "allow", "--wait", "1m"}, "--wait is how long mode ask holds a connection; mode allow holds none"},
		{[]string{"net", "mode", "--vm", "x", "ask", "--wait", "1ms"}, "--wait 1ms is not whole seconds from 1s to 600s"},
		{[]string{"net", "approve", "--vm", "x", "1"}, "VM x does not run, so no ask is pending"},
		{[]string{"net", "deny", "--vm", "x", "1", "2"}, "VM x does not run, so no ask is pending"},
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
	// Mode ask: its wait in net show, status and JSON; nothing pending while stopped.
	mustRun(t, repo, st, "net", "mode", "--vm", "x", "ask", "--wait", "90s")
	if r := mustRun(t, repo, st, "net", "show", "x"); !strings.Contains(r.stdout, "ask:     a name off the allow-list waits up to 90 s for your answer; 0 waiting now (agent-vm net pending x)") {
		t.Errorf("net show after net mode ask:\n%s", r.stdout)
	}
	if r := mustRun(t, repo, st, "status", "x"); !strings.Contains(r.stdout, "network:    allow-list (the default and *.example.com, 203.0.113.7), other names asked about (0 pending)") {
		t.Errorf("status in mode ask:\n%s", r.stdout)
	}
	if n := statusJSON(t, st, "x")["net"].(map[string]any); n["mode"] != "ask" || n["ask_wait_s"] != 90.0 {
		t.Errorf("status --json net in mode ask: %v", n)
	}
	if r := mustRun(t, repo, st, "net", "pending", "x"); r.stdout != "VM x: no connection waits for an answer\n" {
		t.Errorf("net pending of a stopped VM: %q", r.stdout)
	}
	if r := mustRun(t, repo, st, "net", "pending", "--json", "x"); !strings.Contains(r.stdout, `"asks": []`) {
		t.Errorf("net pending --json of a stopped VM: %q", r.stdout)
	}
	mustRun(t, repo, st, "net", "mode", "--vm", "x", "offline")
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

// The shipped build (no agentvm_testhooks tag, as `go test` builds this
// package) does not claim the proxy's test hooks in its version line; the
// tests' own agent-vm (tu.AgentVMBinary) has them and says so.
func TestShippedBuildClaimsNoTestHooks(t *testing.T) {
	if egress.TestHooks {
		// Skip, not SkipOrFail: nothing is missing here; the build this
		// test is about is the other one.
		t.Skip("built with -tags agentvm_testhooks: this test is about the build without")
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

// A repository's policy file, as net show prints it: its part of the
// policy said, its request rules marked; the JSON carries it.
func TestNetShowSaysWhatTheRepositoryPolicySets(t *testing.T) {
	repo := tu.Repo(t, false)
	tu.WriteFile(t, filepath.Join(repo, ".agent-vm", "policy.toml"), "allow = [\"pypi.org\"]\nrequests = [\"deny POST api.example.com/x\"]\n")
	tu.Git(t, repo, "add", ".")
	tu.Git(t, repo, "commit", "--quiet", "-m", "policy")
	st := t.TempDir()
	mustRun(t, repo, st, "create", "feat", "--backend", "qemu", "--memory", "1G", "--cpus", "1")
	r := mustRun(t, repo, st, "net", "show", "feat")
	for _, want := range []string{"from the repository's feat:.agent-vm/policy.toml, as the VM was made: allow pypi.org; 1 request rules", "deny  POST api.example.com/x  (repository)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("net show lacks %q:\n%s", want, r.stdout)
		}
	}
	r = mustRun(t, repo, st, "net", "show", "feat", "--json")
	var info struct {
		Repository struct {
			File  string
			Allow []string
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || info.Repository.File != "feat:.agent-vm/policy.toml" || len(info.Repository.Allow) != 1 {
		t.Errorf("net show --json: %+v, %v\n%s", info, err, r.stdout)
	}
}
