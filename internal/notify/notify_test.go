package notify

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/session"
)

// states are the listings the watcher sees, one a poll: each "name=state"
// (state "x" is exited).
func lister(polls [][]string, done chan<- struct{}) func(context.Context) ([]session.Info, error) {
	var mu sync.Mutex
	i := 0
	return func(context.Context) ([]session.Info, error) {
		mu.Lock()
		defer mu.Unlock()
		if i == len(polls) {
			close(done)
			i++
		}
		if i >= len(polls) {
			return nil, context.Canceled
		}
		var infos []session.Info
		for _, s := range polls[i] {
			name, state, _ := strings.Cut(s, "=")
			infos = append(infos, session.Info{Name: name, State: state, StateFrom: "hooks", Message: "asks \x1b[31m" + name})
		}
		i++
		return infos, nil
	}
}

// watch runs a Watcher over polls, a second apart on a fake clock, with a
// FAKE runner at the exec boundary (notify-send and sh recorded, not run).
func watch(t *testing.T, polls [][]string, dbus bool, onWait string) []execxtest.Call {
	fake := execxtest.New(t).Installed("notify-send", "/usr/bin/notify-send").
		On("notify-send", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{} }).
		On("sh", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{} })
	clock := time.Unix(1795436800, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	w := &Watcher{Branch: "feat/x", VM: "feat-x", List: lister(polls, done), Run: fake, Log: hclog.NewNullLogger(), Every: time.Millisecond,
		Getenv: func(k string) string {
			if k == "DBUS_SESSION_BUS_ADDRESS" && dbus {
				return "unix:path=/run/user/1000/bus"
			}
			return ""
		},
		OnWait: func() (string, error) { return onWait, nil },
		Now:    func() time.Time { clock = clock.Add(time.Second); return clock }}
	go w.Watch(ctx)
	<-done
	cancel()
	return fake.Calls()
}

// Only a turn into waiting or done is news: the states first seen are
// not, working is not, and a session flipping back and forth is told about
// once in MinGap.
func TestWatcherTellsOfTurnsToWaiting(t *testing.T) {
	calls := watch(t, [][]string{
		{"old=waiting", "a=working"},
		{"old=waiting", "a=waiting", "b=done"},
		{"old=waiting", "a=working", "b=done"},
		{"old=waiting", "a=waiting", "b=x"}, // a: again within MinGap
	}, true, "echo hi")
	var told []string
	for _, c := range calls {
		if filepath.Base(c.Path) == "sh" {
			env := strings.Join(c.Env, " ")
			if !slices.Contains(c.Args, "echo hi") || !strings.Contains(env, "AGENT_VM_BRANCH=feat/x") || !strings.Contains(env, "AGENT_VM_VM=feat-x") ||
				!strings.Contains(env, `AGENT_VM_MESSAGE=asks \x1b[31m`) {
				t.Errorf("on_wait call: %+v", c)
			}
			for _, e := range c.Env {
				if s, ok := strings.CutPrefix(e, "AGENT_VM_SESSION="); ok {
					told = append(told, s)
				}
			}
		}
	}
	if strings.Join(told, " ") != "a b" {
		t.Errorf("on_wait ran for %q, want a then b; calls: %+v", told, calls)
	}
	if n := len(calls); n != 4 || filepath.Base(calls[0].Path) != "notify-send" || !strings.Contains(strings.Join(calls[0].Args, " "), "agent-vm: feat/x, session a waits for you") {
		t.Errorf("calls = %+v, want notify-send and sh for each", calls)
	}
}

// Without a session bus there is no desktop notification; without a
// command, nothing runs.
func TestWatcherWithoutBusOrCommand(t *testing.T) {
	if calls := watch(t, [][]string{{"a=working"}, {"a=waiting"}}, false, ""); len(calls) != 0 {
		t.Errorf("calls = %+v, want none", calls)
	}
}

// The command is the VM's own (run --on-wait) while it has one, else the
// config's; it really runs, with the variables in its environment.
func TestOnWaitRuns(t *testing.T) {
	run := t.TempDir()
	config := func() (string, error) { return "config's", nil }
	if got, err := OnWait(run, config); err != nil || got != "config's" {
		t.Fatalf("OnWait without the VM's = %q, %v", got, err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if err := SetOnWait(run, `printf '%s|%s|%s' "$AGENT_VM_SESSION" "$AGENT_VM_STATE" "$AGENT_VM_MESSAGE" > `+out); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(run, OnWaitFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the VM's on_wait file: %v %v", fi, err)
	}
	if err := SetOnWait(run, "a\x00b"); err == nil {
		t.Error("a command with NUL was kept")
	}
	w := &Watcher{Branch: "b", VM: "b", Run: execx.OS{}, Getenv: func(string) string { return "" }, Log: hclog.NewNullLogger(),
		OnWait: func() (string, error) { return OnWait(run, config) }}
	w.notify(context.Background(), session.Info{Name: "claude", State: "waiting", Message: "May I? $(touch /tmp/pwned)"})
	if b, err := os.ReadFile(out); err != nil || string(b) != "claude|waiting|May I? $(touch /tmp/pwned)" {
		t.Errorf("the command wrote %q, %v", b, err)
	}
}

// A new ask is told once, however many come in one poll; an ask that ended
// is forgotten.
func TestWatcherTellsOfAsks(t *testing.T) {
	fake := execxtest.New(t).On("sh", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{} })
	var polls = [][]egress.Ask{
		nil,
		{{ID: 1, Token: "a", Host: "pypi.example.org", Port: 443, Method: "CONNECT"}, {ID: 2, Token: "b"}, {ID: 3, Token: "c"}},
		{{ID: 1, Token: "a"}},
		{{ID: 4, Token: "d", Host: "x.example", Port: 80, Method: "GET"}},
	}
	w := &Watcher{Branch: "b", VM: "b", Run: fake, Getenv: func(string) string { return "" }, Log: hclog.NewNullLogger(),
		OnWait: func() (string, error) { return "true", nil }}
	told := map[string]bool{}
	for _, p := range polls {
		w.Asks = func() ([]egress.Ask, error) { return p, nil }
		w.newAsks(context.Background(), told)
	}
	var msgs []string
	for _, c := range fake.Calls() {
		if !slices.Contains(c.Env, "AGENT_VM_STATE=ask") || !slices.Contains(c.Env, "AGENT_VM_SESSION=net") {
			t.Errorf("an ask's command environment: %q", c.Env)
		}
		for _, e := range c.Env {
			if m, ok := strings.CutPrefix(e, "AGENT_VM_MESSAGE="); ok {
				msgs = append(msgs, m)
			}
		}
	}
	want := []string{
		"asks to reach pypi.example.org:443 (CONNECT): agent-vm net approve --vm b 1, or net deny (and 2 more: agent-vm net pending b)",
		"asks to reach x.example:80 (GET): agent-vm net approve --vm b 4, or net deny",
	}
	if !slices.Equal(msgs, want) {
		t.Errorf("told:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}
	if !told["d"] || told["b"] {
		t.Errorf("told = %v: want the pending one, not the ended", told)
	}
}

// Desktop shows one notification where there is a session bus and
// notify-send, and nothing elsewhere; a failing notify-send is only
// logged. The runner is a FAKE at the exec boundary (calls recorded).
func TestDesktop(t *testing.T) {
	bus := func(k string) string {
		if k == "DBUS_SESSION_BUS_ADDRESS" {
			return "unix:path=/run/user/1000/bus"
		}
		return ""
	}
	none := func(string) string { return "" }
	for _, tc := range []struct {
		name      string
		getenv    func(string) string
		installed bool
		fails     bool
		calls     int
	}{
		{"bus and notify-send", bus, true, false, 1},
		{"no session bus", none, true, false, 0},
		{"no notify-send", bus, false, false, 0},
		{"notify-send fails", bus, true, true, 1},
	} {
		fake := execxtest.New(t).On("notify-send", func(execxtest.Call) execxtest.Reply {
			if tc.fails {
				return execxtest.Reply{ExitCode: 1, Stderr: "no server"}
			}
			return execxtest.Reply{}
		})
		if !tc.installed {
			fake = fake.Installed("notify-send", "") // not on PATH
		}
		Desktop(context.Background(), fake, tc.getenv, hclog.NewNullLogger(), "agent-vm: feat/x did not wake", "`agent-vm resume feat-x` says why")
		calls := fake.Calls()
		if len(calls) != tc.calls {
			t.Errorf("%s: calls %+v, want %d", tc.name, calls, tc.calls)
			continue
		}
		if tc.calls == 1 && !slices.Equal(calls[0].Args, []string{"--app-name=agent-vm", "--", "agent-vm: feat/x did not wake", "`agent-vm resume feat-x` says why"}) {
			t.Errorf("%s: notify-send %q", tc.name, calls[0].Args)
		}
	}
}
