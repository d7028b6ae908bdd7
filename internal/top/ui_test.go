package top

import (
	"context"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

func snapshot() Snapshot {
	return Snapshot{Taken: time.Date(2026, 11, 30, 1, 2, 3, 0, time.Local), Rows: []Row{
		{VM: "feat-a", Branch: "feat/a", Repo: "/home/u/alpha", State: "running", Live: Live{Agent: agentstate.Waiting, CPU: 12.4, PSS: 650 << 20, Conns: 9, Refused: 2,
			Sessions: []session.Info{{Name: "claude", State: agentstate.Waiting, Message: "May I run \x1b[2Jmake?"}}, Last: "> Bash(make test)"}},
		{VM: "feat-b", Branch: "feat/b-日本語-a-long-branch-name", Repo: "/home/u/beta", State: "running", Live: Live{CPU: -1, PSS: -1,
			Asks: []egress.Ask{{ID: 3, Host: "pypi.example.org", Port: 443, Method: "CONNECT"}}}},
		{VM: "main", Branch: "main", Repo: "/home/u/alpha", State: "suspended", Suspend: "saved", Live: Live{CPU: -1, PSS: -1}},
	}}
}

// The screen fits 80 columns, escapes what the guest wrote, and shows
// the selected VM's detail: what its agent asks, or its oldest ask.
func TestScreen(t *testing.T) {
	text := Text(snapshot(), 80, 24)
	for i, l := range strings.Split(text, "\n") {
		if w := termsafe.Width(l); w > 80 {
			t.Errorf("line %d is %d columns: %q", i, w, l)
		}
	}
	for _, want := range []string{"agent-vm top  3 VMs, 2 need you  01:02:03", "feat/a", "waiting", "650M", "9/2", "12", "suspended", "feat/b-日本語-a-l…"} {
		if !strings.Contains(text, want) {
			t.Errorf("the screen lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "\x1b") {
		t.Errorf("the screen has an escape (NO_COLOR, and the agent's message): %q", text)
	}
	m := &model{snap: snapshot(), loaded: true, width: 80, height: 24}
	if s := m.render(); !strings.Contains(s, "claude: May I run \\x1b[2Jmake?") || !strings.Contains(s, "> Bash(make test)") || !strings.Contains(s, "\x1b[7m") {
		t.Errorf("the selected VM's detail:\n%s", s)
	}
	m.sel = 1
	if s := m.render(); !strings.Contains(s, "asks to reach pypi.example.org:443 (CONNECT), ask 3") {
		t.Errorf("an ask in the detail:\n%s", s)
	}
	m.sel = 2
	if s := m.render(); !strings.Contains(s, "suspended: its memory saved to disk") {
		t.Errorf("a suspended VM's detail:\n%s", s)
	}
	m.width, m.height = 50, 8
	if s := m.render(); s != "agent-vm top: the terminal is 50x8; top needs at least 60x10" {
		t.Errorf("a small terminal: %q", s)
	}
}

// The keys: moving, the filter, and agent-vm's own commands for the
// selected VM, run through a FAKE runner at the exec boundary (recorded,
// not run); destroy waits for y.
func TestKeys(t *testing.T) {
	fake := execxtest.New(t).On("agent-vm", func(c execxtest.Call) execxtest.Reply {
		return execxtest.Reply{Stdout: "did: " + strings.Join(c.Args, " ") + "\n"}
	})
	m := &model{snap: snapshot(), loaded: true, width: 80, height: 24, ctx: context.Background(),
		o: Options{Self: "agent-vm", StateDir: "/st", Run: fake}}
	press := func(keys ...string) {
		for _, k := range keys {
			if cmd := m.key(k); cmd != nil {
				if msg, ok := cmd().(doneMsg); ok {
					m.Update(msg)
				}
			}
		}
	}
	press("/", "b", "e", "t", "a", "enter")
	if rs := m.rows(); len(rs) != 1 || rs[0].VM != "feat-b" {
		t.Fatalf("filter beta: %+v", rs)
	}
	press("y")
	press("esc", "/", "esc", "j", "j", "s", "d", "x", "d", "y")
	var got []string
	for _, c := range fake.Calls() {
		got = append(got, strings.Join(c.Args, " "))
	}
	want := []string{"--state-dir /st net approve --vm feat-b 3", "--state-dir /st suspend main", "--state-dir /st destroy main"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("commands run:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if m.msg != "did: --state-dir /st destroy main" {
		t.Errorf("message = %q", m.msg)
	}
	if cmd := m.key("q"); cmd == nil {
		t.Error("q does not quit")
	} else if _, ok := cmd().(tea.QuitMsg); !ok {
		t.Error("q does not quit")
	}
}
