package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/session"
)

func TestSessionEnv(t *testing.T) {
	env := map[string]string{"ANTHROPIC_API_KEY": "sk-host", "TOKEN": "from-host"}
	getenv := func(k string) string { return env[k] }
	var notes []string
	notify := func(s string) { notes = append(notes, s) }

	vars, err := sessionEnv([]string{"TOKEN", "EXTRA=given=with=equals", "ANTHROPIC_API_KEY=override"}, getenv, notify)
	if err != nil {
		t.Fatal(err)
	}
	want := []session.Var{{Name: "TOKEN", Value: "from-host"}, {Name: "EXTRA", Value: "given=with=equals"}, {Name: "ANTHROPIC_API_KEY", Value: "override"}}
	if len(vars) != len(want) {
		t.Fatalf("vars: %v", vars)
	}
	for i := range want {
		if vars[i] != want[i] {
			t.Errorf("var %d: got %s=%q, want %s=%q", i, vars[i].Name, vars[i].Value, want[i].Name, want[i].Value)
		}
	}
	// NAME=VALUE warns (twice here), a credential's name too (once), and
	// no note shows a value.
	if len(notes) != 3 || !strings.Contains(notes[0], "shell's history") || !strings.HasPrefix(notes[1], "--env ANTHROPIC_API_KEY: its value enters the VM") || !strings.Contains(notes[2], "shell's history") {
		t.Errorf("notes: %q", notes)
	}
	for _, n := range notes {
		if strings.Contains(n, "given") || strings.Contains(n, "override") {
			t.Errorf("a note shows a value: %q", n)
		}
	}

	// The agent's own key is not --env's (agentKey); an unset --env NAME
	// and a bad name are refused, naming them.
	if vars, _ := sessionEnv(nil, getenv, notify); len(vars) != 0 {
		t.Errorf("no --env, yet variables: %v", vars)
	}
	for in, msg := range map[string]string{"NOPE": "NOPE is not set", "1X=v": `"1X" is not an environment variable name`, "=v": `"" is not`} {
		if _, err := sessionEnv([]string{in}, getenv, notify); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("--env %q: got %v, want %q", in, err, msg)
		}
	}
}

// An --env name that looks like a credential's is warned about, naming
// `agent-vm secret set`; other names are not.
func TestSessionEnvWarnsOfCredentials(t *testing.T) {
	getenv := func(string) string { return "v" }
	for name, warned := range map[string]bool{
		"DEPLOY_KEY": true, "gh_token": true, "AWS_SECRET": true, "DB_PASSWORD": true, "MY_API_KEY_FILE": true, "OPENAI_API_KEY": true,
		"KEY": false, "TOKEN": false, "KEYBOARD": false, "TOKENS_DIR": false, "PASSWORD_HINT": false, "PATH": false,
	} {
		for _, arg := range []string{name, name + "=given"} {
			var notes []string
			if _, err := sessionEnv([]string{arg}, getenv, func(s string) { notes = append(notes, s) }); err != nil {
				t.Fatal(err)
			}
			want := "--env " + name + ": its value enters the VM, where the agent can read it; `agent-vm secret set " + name + "` keeps it on the host and lets the egress proxy add it to requests instead"
			if got := slices.Contains(notes, want); got != warned {
				t.Errorf("--env %s: warned %v, want %v: %q", arg, got, warned, notes)
			}
		}
	}
}

func TestAgentCommand(t *testing.T) {
	argv, key, err := agentCommand("claude", []string{"--model", "x"}, "main")
	if err != nil || strings.Join(argv, " ") != "claude --model x" || strings.Join(key, " ") != "ANTHROPIC_API_KEY CLAUDE_CODE_OAUTH_TOKEN" {
		t.Errorf("claude: %v %q %v", argv, key, err)
	}
	argv, key, err = agentCommand("./bin/my agent", nil, "main")
	if err == nil || !strings.Contains(err.Error(), "give one program") {
		t.Errorf("a program with a space: %v %q %v", argv, key, err)
	}
	argv, key, err = agentCommand("./bin/tool", []string{"a b"}, "main")
	if err != nil || len(argv) != 2 || argv[1] != "a b" || len(key) != 0 {
		t.Errorf("a program: %v %q %v", argv, key, err)
	}
	if _, _, err := agentCommand("", nil, "main"); err == nil || !strings.Contains(err.Error(), "--agent claude|codex|gemini") {
		t.Errorf("no agent: %v", err)
	}
}

func TestPickSession(t *testing.T) {
	infos := []session.Info{{Name: "claude"}, {Name: "claude-2"}}
	if _, err := pickSession(infos, "", "main"); err == nil || !strings.Contains(err.Error(), "claude, claude-2") {
		t.Errorf("two sessions, none named: %v", err)
	}
	if in, err := pickSession(infos, "claude-2", "main"); err != nil || in.Name != "claude-2" {
		t.Errorf("named: %v %v", in, err)
	}
	if _, err := pickSession(nil, "", "main"); err == nil || !strings.Contains(err.Error(), "agent-vm run main") {
		t.Errorf("none: %v", err)
	}
	if got := freeName(infos, "claude"); got != "claude-3" {
		t.Errorf("freeName: %q", got)
	}
	long := strings.Repeat("x", 40)
	if got := freeName([]session.Info{{Name: long}}, long); len(got) > 40 || session.CheckName(got) != nil {
		t.Errorf("freeName of a long name: %q", got)
	}
	// --new: a free name stands, a taken one moves on unless the user gave it.
	if got, err := newName(infos, "codex", true, "main"); err != nil || got != "codex" {
		t.Errorf("newName of a free name: %q, %v", got, err)
	}
	if got, err := newName(infos, "claude", false, "main"); err != nil || got != "claude-3" {
		t.Errorf("newName of a taken name: %q, %v", got, err)
	}
	if _, err := newName(infos, "claude-2", true, "main"); err == nil || !strings.Contains(err.Error(), "`agent-vm attach main --session claude-2`") {
		t.Errorf("newName of a taken name the user gave: %v", err)
	}
}

// TestAgentKey: a contained VM gets no value (its guest holds the
// placeholder, or the user hears why not); one that is not contained gets
// the value, with a warning that names no value.
func TestAgentKey(t *testing.T) {
	getenv := func(k string) string { return map[string]string{"ANTHROPIC_API_KEY": "sk-host-canary"}[k] }
	for _, c := range []struct {
		name  string
		vm    VM
		key   string
		pass  bool
		notes string
	}{
		{"placeholder held", VM{Slug: "a", Contained: true, Secrets: []string{"ANTHROPIC_API_KEY"}}, "ANTHROPIC_API_KEY", false, ""},
		{"started without it", VM{Slug: "a", Contained: true}, "ANTHROPIC_API_KEY", false, "was started without it"},
		{"contained, unset here", VM{Slug: "a", Contained: true}, "OPENAI_API_KEY", false, ""},
		{"not contained", VM{Slug: "a", Backend: "vagrant"}, "ANTHROPIC_API_KEY", true, "not contained (vagrant backend)"},
		{"not contained, unset", VM{Slug: "a", Backend: "vagrant"}, "OPENAI_API_KEY", false, ""},
		{"no key variable", VM{Slug: "a"}, "", false, ""},
	} {
		var notes []string
		vars := agentKey(c.vm, c.key, getenv, func(s string) { notes = append(notes, s) })
		if c.pass != (len(vars) == 1 && vars[0] == session.Var{Name: c.key, Value: "sk-host-canary"}) || (!c.pass && len(vars) != 0) {
			t.Errorf("%s: vars %v", c.name, vars)
		}
		got := strings.Join(notes, "\n")
		if (c.notes == "") != (got == "") || !strings.Contains(got, c.notes) || strings.Contains(got, "canary") {
			t.Errorf("%s: notes %q, want one with %q", c.name, got, c.notes)
		}
	}
}
