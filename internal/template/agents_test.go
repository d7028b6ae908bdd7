package template

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

func pins(t *testing.T, list string) []guest.AgentPin {
	t.Helper()
	p, err := guest.ParseAgentPins(list)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The probe runs as a shell script: here against a scratch npm root with
// stand-ins (labelled as such) for sudo, cloud-init and the agents'
// programs, the commands the guest has, and this host's python3. A
// missing package and a program that does not run stop it with the agent
// named.
func TestAgentProbeRuns(t *testing.T) {
	testutil.Program(t, "python3") // /usr/bin's, on the probe's PATH
	dir := t.TempDir()
	root, bin := filepath.Join(dir, "lib"), filepath.Join(dir, "bin")
	write := func(p, s string, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), mode); err != nil {
			t.Fatal(err)
		}
	}
	// Stand-ins: sudo runs its command (after -u USER -H --); cloud-init
	// is done.
	write(filepath.Join(bin, "sudo"), "#!/bin/sh\nshift 4\nexec \"$@\"\n", 0o755)
	write(filepath.Join(bin, "cloud-init"), "#!/bin/sh\nexit 0\n", 0o755)
	// Claude Code at its pinned version is its program's package alone
	// (guest.Agent.Specs): that package's package.json says the version.
	claude, _ := guest.LookupAgent("claude")
	installed := claude.Installed("2.1.332", runtime.GOARCH)
	write(filepath.Join(root, installed, "package.json"), `{"name":"`+installed+`","engines":{"version":"0.0.1"},"version":"2.1.332"}`, 0o644)
	write(filepath.Join(bin, "claude"), "#!/bin/sh\necho '2.1.332 (Claude Code)'\n", 0o755)
	run := func(list string) (string, string, error) {
		cmd := exec.Command("sh", "-c", agentProbe(pins(t, list), root))
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		return out.String(), errOut.String(), err
	}
	out, stderr, err := run("claude")
	if err != nil {
		t.Fatalf("probe: %v: %s", err, stderr)
	}
	got, err := ParseAgentProbe(out, pins(t, "claude"))
	if err != nil || got["claude"] != "2.1.332" {
		t.Errorf("probe said %q: %v %v", out, got, err)
	}
	if _, stderr, err := run("claude,codex"); err == nil || !strings.Contains(stderr, "codex is not installed") {
		t.Errorf("a missing codex: %v, %q", err, stderr)
	}
	write(filepath.Join(bin, "claude"), "#!/bin/sh\necho 'Error: cannot find module' >&2\nexit 1\n", 0o755)
	if _, stderr, err := run("claude"); err == nil || !strings.Contains(stderr, "claude is installed but does not run: Error: cannot find module") {
		t.Errorf("a broken claude: %v, %q", err, stderr)
	}
}

func TestParseAgentProbe(t *testing.T) {
	if _, err := ParseAgentProbe("claude 2.1.332\n", pins(t, "claude@2.1.300")); err == nil || !strings.Contains(err.Error(), "claude 2.1.300 was asked for, and npm installed 2.1.332") {
		t.Errorf("another version than asked for: %v", err)
	}
	if got, err := ParseAgentProbe("claude 2.1.400\n", pins(t, "claude@latest")); err != nil || got["claude"] != "2.1.400" {
		t.Errorf("a dist-tag takes what npm installed: %v %v", got, err)
	}
	if _, err := ParseAgentProbe("claude 2.1.332\n", pins(t, "claude,codex")); err == nil || !strings.Contains(err.Error(), "which version of codex") {
		t.Errorf("a missing line: %v", err)
	}
	if _, err := ParseAgentProbe("claude 2.1.332\ncodex 0.171.0\n", pins(t, "claude")); err == nil {
		t.Error("an agent not asked for was accepted")
	}
	if got, err := ParseAgentProbe("", nil); err != nil || len(got) != 0 {
		t.Errorf("no agents: %v %v", got, err)
	}
}

func TestStale(t *testing.T) {
	claude := guest.Agents[0]
	if got := StaleAgents(map[string]string{"claude": "2.0.9"}); len(got) != 1 || !strings.Contains(got[0], "claude 2.0.9 is older than the "+claude.Version) {
		t.Errorf("an older claude: %q", got)
	}
	for _, v := range []string{claude.Version, "9.0.0", "2.1.400"} {
		if got := StaleAgents(map[string]string{"claude": v}); len(got) != 0 {
			t.Errorf("claude %s is said to be older: %q", v, got)
		}
	}
	for _, c := range []struct {
		a, b  string
		older bool
	}{
		{"1.2.3", "1.2.4", true}, {"1.10.0", "1.9.0", false}, {"2.0.0-beta.1", "2.0.0", true}, {"2.0.0", "2.0.0", false}, {"0.61.0", "0.171.0", true},
	} {
		if got := older(c.a, c.b); got != c.older {
			t.Errorf("older(%s, %s) = %v", c.a, c.b, got)
		}
	}
	now := Current{Contract: Contract, AgentVM: "bin", CAs: "cas"}
	key := Key{Contract: Contract, AgentVM: "bin", CAs: "cas"}
	if got := now.Stale(Info{Key: &key, Agents: map[string]string{"claude": claude.Version}}, ""); len(got) != 0 {
		t.Errorf("a current template: %q", got)
	}
	other := key
	other.AgentVM = "old"
	if got := now.Stale(Info{Key: &other}, "made on the base image a; new VMs boot b, so none starts from it"); len(got) != 2 || !strings.Contains(got[0], "another agent-vm binary") || !strings.Contains(got[1], "base image") {
		t.Errorf("another binary and base: %q", got)
	}
	other = key
	other.Contract = Contract - 1
	if got := now.Stale(Info{Key: &other}, ""); len(got) != 1 || !strings.Contains(got[0], "guest contract") {
		t.Errorf("an older contract: %q", got)
	}
	other = key
	other.CAs = "older"
	if got := now.Stale(Info{Key: &other}, ""); len(got) != 1 || !strings.Contains(got[0], "CA certificates") {
		t.Errorf("other CAs: %q", got)
	}
	other.NoHostCA = true
	if got := now.Stale(Info{Key: &other}, ""); len(got) != 0 {
		t.Errorf("a template that trusts no host CA is stale for the host's CAs: %q", got)
	}
	c := check("/t", []Info{{Slug: "t-1", Ready: true, Stale: []string{"claude 2.0.9 is older"}}}, nil)
	if !c.OK || !strings.Contains(c.Detail, "t-1: claude 2.0.9 is older") || !strings.Contains(c.Hint, "template build") {
		t.Errorf("doctor's line: %+v", c)
	}
}

// CurrentOf picks the newest ready, fresh template of the key that holds
// the agents asked for, and none when the newest such one lacks one.
func TestCurrentOf(t *testing.T) {
	claude := guest.AgentPin{Agent: guest.Agent{Name: "claude", Version: "2.0.0"}, At: "2.0.0"}
	ts := []Info{
		{Slug: "k-1", Ready: true, Agents: map[string]string{"claude": "2.0.0"}},
		{Slug: "other-2", Ready: true, Agents: map[string]string{"claude": "2.0.0"}},
		{Slug: "k-3", Ready: false, Agents: map[string]string{"claude": "2.0.0"}},
		{Slug: "k-4", Ready: true, Agents: map[string]string{"claude": "2.0.0"}, Stale: []string{"agent-vm changed"}},
	}
	if got := CurrentOf(ts, "k-", []guest.AgentPin{claude}); got != "k-1" {
		t.Errorf("got %q, want k-1 (k-3 is not ready, k-4 is stale, other-2 is another key's)", got)
	}
	ts = append(ts, Info{Slug: "k-5", Ready: true, Agents: map[string]string{"codex": "1.0.0"}})
	if got := CurrentOf(ts, "k-", []guest.AgentPin{claude}); got != "" {
		t.Errorf("got %q, want none: the newest current template lacks claude", got)
	}
	if got := CurrentOf(nil, "k-", nil); got != "" {
		t.Errorf("no templates: got %q", got)
	}
}
