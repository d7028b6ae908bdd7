package agentstate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

func TestParse(t *testing.T) {
	long := strings.Repeat("é", MaxMessage+5)
	for _, tc := range []struct {
		payload, state, event, message, err string
	}{
		{`{"hook_event_name":"UserPromptSubmit","prompt":"fix it"}`, Working, "UserPromptSubmit", "", ""},
		{`{"hook_event_name":"PostToolUse","tool_name":"Bash"}`, Working, "PostToolUse", "", ""},
		{`{"hook_event_name":"Notification","message":"Claude needs your permission to use Bash\n\u001b[31mnow\u202e"}`, Waiting, "Notification", "Claude needs your permission to use Bash [31mnow", ""},
		{`{"hook_event_name":"Notification","message":"` + long + `"}`, Waiting, "Notification", strings.Repeat("é", MaxMessage) + "…", ""},
		{`{"hook_event_name":"Stop","stop_hook_active":false}`, Done, "Stop", "", ""},
		{`{"type":"agent-turn-complete","last-assistant-message":"All tests pass."}`, Done, "agent-turn-complete", "All tests pass.", ""},
		{`{"hook_event_name":"SessionEnd"}`, "", "", "", `says nothing agent-vm reads (event "SessionEnd"`},
		{`not json`, "", "", "", "is not JSON"},
		{`{"hook_event_name":"Stop","pad":"` + strings.Repeat("x", MaxPayload) + `"}`, "", "", "", "is over 65536 bytes"},
	} {
		r, err := Parse([]byte(tc.payload))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Parse(%.60q): %v, want an error with %q", tc.payload, err, tc.err)
		case tc.err == "" && (err != nil || r.State != tc.state || r.Event != tc.event || r.Message != tc.message):
			t.Errorf("Parse(%.60q) = %+v, %v; want %s %s %q", tc.payload, r, err, tc.state, tc.event, tc.message)
		}
	}
}

// The hooks' arguments are what the agents take: Claude Code's --settings
// JSON with the four hooks running the guest command, Codex's -c notify.
func TestHookArgs(t *testing.T) {
	args := ClaudeArgs()
	var s struct {
		Hooks map[string][]struct {
			Hooks []struct{ Type, Command string }
		}
	}
	if len(args) != 2 || args[0] != "--settings" || json.Unmarshal([]byte(args[1]), &s) != nil || len(s.Hooks) != 4 {
		t.Fatalf("ClaudeArgs = %q", args)
	}
	for _, ev := range []string{"UserPromptSubmit", "PostToolUse", "Notification", "Stop"} {
		if h := s.Hooks[ev]; len(h) != 1 || len(h[0].Hooks) != 1 || h[0].Hooks[0].Command != "agent-vm agent-state" || h[0].Hooks[0].Type != "command" {
			t.Errorf("hook %s: %+v", ev, h)
		}
	}
	if got := strings.Join(CodexArgs(), " "); got != `-c notify=["agent-vm","agent-state"]` {
		t.Errorf("CodexArgs = %s", got)
	}
}

// Record sets the session's options on a real tmux server, as the hook
// does from inside the agent's pane ($TMUX, $TMUX_PANE).
func TestRecord(t *testing.T) {
	tu.Program(t, "tmux")
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	tmux := func(args ...string) string {
		out, err := exec.Command("tmux", append([]string{"-S", sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	tmux("new-session", "-d", "-s", "agent", "sleep 60")
	t.Cleanup(func() { exec.Command("tmux", "-S", sock, "kill-server").Run() })
	pane := tmux("display-message", "-p", "-t", "agent", "#{pane_id}")
	t.Setenv("TMUX", sock+",1,0")
	ctx := context.Background()
	if err := Record(ctx, execx.OS{}, "", Report{State: Done}, time.Now()); err == nil || !strings.Contains(err.Error(), "$TMUX_PANE is empty") {
		t.Errorf("Record outside a pane: %v", err)
	}
	at := time.Unix(1795436799, 0)
	for msg, want := range map[string]string{
		"May I? 'x' ; kill-server": "May I? 'x' ; kill-server",
		"kill-server;":             "kill-server", // a final ";" would end tmux's command
		`x\;`:                      "x",
	} {
		if err := Record(ctx, execx.OS{}, pane, Report{State: Waiting, Message: msg}, at); err != nil {
			t.Fatal(err)
		}
		got := tmux("display-message", "-p", "-t", "agent", "#{"+StateOption+"}|#{"+AtOption+"}|#{"+MessageOption+"}")
		if got != "waiting|1795436799|"+want {
			t.Errorf("options after %q = %q", msg, got)
		}
	}
}

// A real Claude Code, not logged in, given ClaudeArgs in a tmux pane: its
// UserPromptSubmit hook runs the real `agent-vm agent-state`, which marks
// the session working. The agent-vm on the pane's PATH is a labelled
// recorder around the real one: after each hook it notes the state the
// session was left in, the hook's event and its exit status, so the
// first hook's state is read even where a later hook (or none) follows.
func TestRealClaudeCodeHooks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds agent-vm and runs Claude Code")
	}
	tu.Program(t, "tmux")
	claude, err := filepath.Abs("testdata/node/node_modules/.bin/claude")
	if err != nil {
		t.Fatal(err)
	}
	_, err = os.Stat(claude)
	tu.Need(t, err == nil, "no Claude Code for the test (hint: npm ci --prefix internal/agentstate/testdata/node)")
	bin, notes := t.TempDir(), filepath.Join(t.TempDir(), "hooks")
	recorder := fmt.Sprintf(`#!/bin/sh
# Test recorder (agentstate_test.go): the real agent-vm, then what it left.
payload=$(cat)
printf '%%s' "$payload" | %s "$@"
rc=$?
event=$(printf '%%s' "$payload" | sed -n 's/.*"hook_event_name": *"\([^"]*\)".*/\1/p')
printf '%%s after %%s, exit %%s\n' "$(tmux display-message -p -t "$TMUX_PANE" '#{%s}')" "$event" $rc >>%s
exit $rc
`, execx.ShellQuote(tu.AgentVMBinary(t)), StateOption, execx.ShellQuote(notes))
	if err := os.WriteFile(filepath.Join(bin, "agent-vm"), []byte(recorder), 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	args := ClaudeArgs()
	exited := filepath.Join(t.TempDir(), "exited")
	script := fmt.Sprintf("PATH=%s:$PATH HOME=%s %s -p hello %s %s; echo claude exited $? | tee %s; sleep 60",
		bin, t.TempDir(), claude, args[0], execx.ShellQuote(args[1]), exited)
	if out, err := exec.Command("tmux", "-S", sock, "-f", "/dev/null", "new-session", "-d", "-s", "agent", script).CombinedOutput(); err != nil {
		t.Fatalf("tmux: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("tmux", "-S", sock, "kill-server").Run() })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var first string
	err = tu.Poll(ctx, "a hook to run", func() bool {
		b, _ := os.ReadFile(notes)
		first, _, _ = strings.Cut(string(b), "\n")
		return first != ""
	})
	if err != nil || first != Working+" after UserPromptSubmit, exit 0" {
		hooks, _ := os.ReadFile(notes)
		screen, _ := exec.Command("tmux", "-S", sock, "capture-pane", "-p", "-t", "agent").Output()
		t.Fatalf("the first hook: %q, %v; want the UserPromptSubmit hook to leave the session %s.\nThe hooks:\n%s\nThe pane:\n%s", first, err, Working, hooks, screen)
	}
	// Claude Code writes in its HOME, a directory of this test's, until
	// it exits: it must have before the test ends and removes it.
	if err := tu.Poll(ctx, "Claude Code to exit", func() bool { _, err := os.Stat(exited); return err == nil }); err != nil {
		t.Fatal(err)
	}
}
