package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// The refusals of run, attach, sessions and logs --session, none of which
// may make or change anything. (The sessions themselves need a booted VM:
// the integration scenario `sessions` drives them.)
func TestAgentSessionRefusals(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "--backend", "qemu")
	before, err := os.ReadFile(filepath.Join(st, "main", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		dir  string
		args []string
		code int
		want string
	}{
		{repo, []string{"run", "main", "extra", "--agent", "x"}, 2, `run takes one BRANCH, got ["main" "extra"] (hint: the agent's arguments go after --: agent-vm run main -- extra)`},
		{repo, []string{"run", "main", "--agent", "my tool"}, 1, `--agent "my tool": give one program`},
		{repo, []string{"run", "main"}, 1, "no agent to run: VM main was not created with --agent"},
		{repo, []string{"run", "main", "--agent", "claude", "--env", "AGENT_VM_TEST_SURELY_UNSET"}, 1, "AGENT_VM_TEST_SURELY_UNSET is not set in this environment"},
		{repo, []string{"run", "main", "--agent", "claude", "--env", "1BAD"}, 1, `"1BAD" is not an environment variable name`},
		{repo, []string{"run", "main", "--agent", "claude", "--session", "a.b"}, 1, `session name "a.b" is not valid`},
		{repo, []string{"run", "--agent", "x", "nobranch", "--cpus", "0"}, 2, "--cpus 0: must be at least 1"},
		{"", []string{"run", "--agent", "x"}, 2, "is not in a git checkout"},
		{"", []string{"attach", "main", "s", "extra"}, 2, "attach takes at most one BRANCH"},
		{"", []string{"attach", "main", "s", "--session", "s"}, 2, "attach takes at most one BRANCH"},
		{"", []string{"attach", "main", "s"}, 1, "attach BRANCH SESSION is deprecated; write attach main --session s"},
		{"", []string{"attach", "nope"}, 1, "agent-vm list"},
		{"", []string{"attach", "main"}, 1, "is stopped (hint: `agent-vm start main` starts it)"},
		{"", []string{"exec", "main", "--", "true"}, 1, "is stopped (hint: `agent-vm start main` starts it)"},
		{"", []string{"shell", "main"}, 1, "is stopped (hint: `agent-vm start main` starts it)"},
		{"", []string{"sessions", "main"}, 1, "is stopped"},
		{"", []string{"sessions", "main", "--json"}, 1, "is stopped"},
		{"", []string{"sessions", "rm", "main"}, 2, "sessions rm needs --session NAME"},
		{"", []string{"sessions", "rm", "main", "--session", "s"}, 1, "is stopped"},
		{"", []string{"sessions", "rm", "main", "x", "--session", "s"}, 2, "sessions rm takes at most one BRANCH"},
		{"", []string{"sessions", "rm", "main", "s"}, 1, "is stopped"},
		{"", []string{"logs", "main", "--session", "s", "-f"}, 2, "--follow does not go with --session"},
		{"", []string{"logs", "main", "--session", "s"}, 1, "is stopped"},
	}
	for _, c := range cases {
		r := agentVM(t, c.dir, st, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-vm %v: exit %d (want %d and %q)\n%s%s", c.args, r.code, c.code, c.want, r.stdout, r.stderr)
		}
	}
	after, err := os.ReadFile(filepath.Join(st, "main", "config.json"))
	if err != nil || string(after) != string(before) {
		t.Errorf("a refusal changed the record (%v)", err)
	}
	if ents, _ := os.ReadDir(st); len(ents) != 1+countHidden(ents) {
		t.Errorf("a refusal made a VM: %v", ents)
	}
}

func countHidden(ents []os.DirEntry) int {
	n := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			n++
		}
	}
	return n
}

// run for a branch without a VM and without an agent: the VM is made (the
// repository's config.toml could have named the agent), then run says
// what is missing; the VM stays, usable.
func TestRunWithoutAnAgentMakesTheVMAndSaysSo(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	r := agentVM(t, repo, st, "run", "fresh", "--backend", "qemu")
	if r.code != 1 || !strings.Contains(r.stderr, "created VM fresh for branch fresh, but no agent to run") {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if st := statusJSON(t, st, "fresh"); st["state"] != "stopped" {
		t.Errorf("the VM: %v", st["state"])
	}
}
