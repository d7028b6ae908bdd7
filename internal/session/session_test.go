package session

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

// host runs the guest-side command lines on this host, with real sh and
// real tmux, a tmux server of the test's own (TMUX_TMPDIR) and a tmpfs
// directory for the environment hand-off.
type host struct {
	t       *testing.T
	env     []string
	runtime string // the XDG_RUNTIME_DIR the scripts see
	dir     string // the agent's start directory
}

func newHost(t *testing.T) *host {
	t.Helper()
	testutil.Program(t, "tmux")
	testutil.Program(t, "sh")
	st, err := os.Stat("/dev/shm")
	testutil.Need(t, err == nil && st.IsDir(), "no /dev/shm here")
	rt, err := os.MkdirTemp("/dev/shm", "agent-vm-session-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rt) })
	h := &host{t: t, runtime: rt, dir: t.TempDir()}
	tmp := t.TempDir()
	syscall.Umask(0o022)
	h.env = append(os.Environ(), "TMUX_TMPDIR="+tmp, "XDG_RUNTIME_DIR="+rt, "SHELL=/bin/sh", "TMUX=")
	t.Cleanup(func() { h.sh(tmux("kill-server"), nil) })
	return h
}

func (h *host) sh(script string, stdin []byte) (code int, stdout, stderr string) {
	h.t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = h.env
	cmd.Dir = h.dir
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	case err != nil:
		h.t.Fatal(err)
	}
	return 0, out.String(), errOut.String()
}

func (h *host) list() []Info {
	h.t.Helper()
	code, out, errOut := h.sh(List(), nil)
	if code != 0 {
		h.t.Fatalf("list: exit %d: %s", code, errOut)
	}
	infos, err := Parse(out, time.Now())
	if err != nil {
		h.t.Fatal(err)
	}
	return infos
}

// waitFor polls the sessions until cond holds (testutil.Poll).
func (h *host) waitFor(what string, cond func([]Info) bool) []Info {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var infos []Info
	if err := testutil.Poll(ctx, what, func() bool { infos = h.list(); return cond(infos) }); err != nil {
		h.t.Fatalf("%v; sessions: %+v", err, infos)
	}
	return infos
}

func (h *host) start(s Spec) error {
	h.t.Helper()
	s.Dir = h.dir
	cmd, stdin, err := Start(s)
	if err != nil {
		return err
	}
	code, _, errOut := h.sh(cmd, stdin)
	return StartError(code, errOut)
}

func TestNoServerMeansNoSessions(t *testing.T) {
	h := newHost(t)
	if got := h.list(); len(got) != 0 {
		t.Fatalf("sessions before any start: %+v", got)
	}
}

func TestTheAgentGetsItsEnvironmentAndNothingIsLeftBehind(t *testing.T) {
	h := newHost(t)
	secret := "s3cr3t 'quoted' $HOME `x` \"dq\"\nsecond line"
	// The stand-in agent writes what it sees into the start directory,
	// then waits for a line and exits with it.
	err := h.start(Spec{Name: "agent", Heading: "main",
		Argv: []string{"sh", "-c", `umask > umask; printf '%s' "$CANARY" > seen; printf 'args:%s|%s\n' "$1" "$2"; read st; exit "$st"`, "stand-in", "a b", "c'd"},
		Env:  []Var{{"CANARY", secret}, {"OTHER", ""}}})
	if err != nil {
		t.Fatal(err)
	}
	h.waitFor("the agent has read its environment", func([]Info) bool {
		b, err := os.ReadFile(filepath.Join(h.dir, "seen"))
		return err == nil && string(b) == secret
	})
	// The agent has the user's umask, not the hand-off's.
	if b, err := os.ReadFile(filepath.Join(h.dir, "umask")); err != nil || strings.TrimSpace(string(b)) != "0022" {
		t.Errorf("the agent's umask: %q, %v (want the caller's 0022)", b, err)
	}
	// The hand-off file is gone, and no process's command line holds the value.
	ents, err := os.ReadDir(h.runtime)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Errorf("the environment file is still in %s: %v", h.runtime, ents)
	}
	if out, err := exec.Command(testutil.Program(t, "ps"), "-eo", "args").Output(); err != nil || bytes.Contains(out, []byte("s3cr3t")) {
		t.Errorf("the secret is in the process list (or ps failed: %v):\n%s", err, out)
	}
	infos := h.waitFor("the session is listed", func(in []Info) bool { return len(in) == 1 })
	in := infos[0]
	if in.Name != "agent" || in.Exited || in.Attached != 0 || !strings.HasPrefix(in.Command, "sh -c ") || time.Since(in.Started) > time.Minute {
		t.Errorf("running session: %+v", in)
	}
	// A second start of the same name is refused, and leaves no file.
	if err := h.start(Spec{Name: "agent", Argv: []string{"true"}, Env: []Var{{"CANARY", secret}}}); !errors.Is(err, ErrDuplicate) {
		t.Errorf("second start: got %v, want ErrDuplicate", err)
	}
	if ents, _ := os.ReadDir(h.runtime); len(ents) != 0 {
		t.Errorf("a refused start left %v", ents)
	}
	// The agent ends with status 7: the session stays, with its status and
	// its screen.
	if code, _, errOut := h.sh(tmux("send-keys", "-t", pane("agent"), "7", "Enter"), nil); code != 0 {
		t.Fatal(errOut)
	}
	infos = h.waitFor("the agent has exited", func(in []Info) bool { return len(in) == 1 && in[0].Exited })
	if in := infos[0]; in.Status != 7 || in.EndedAt == nil {
		t.Errorf("exited session: %+v", in)
	}
	code, out, errOut := h.sh(Scrollback("agent"), nil)
	if code != 0 || !strings.Contains(out, "args:a b|c'd") {
		t.Errorf("scrollback: exit %d, %q, %s", code, out, errOut)
	}
	if code, _, errOut := h.sh(Remove("agent"), nil); code != 0 {
		t.Fatal(errOut)
	}
	if got := h.list(); len(got) != 0 {
		t.Errorf("after remove: %+v", got)
	}
}

func TestAnAgentThatEndsAtOnceKeepsItsStatus(t *testing.T) {
	h := newHost(t)
	if err := h.start(Spec{Name: "quick", Argv: []string{"sh", "-c", "echo bye; exit 3"}}); err != nil {
		t.Fatal(err)
	}
	infos := h.waitFor("the agent has exited", func(in []Info) bool { return len(in) == 1 && in[0].Exited })
	if infos[0].Status != 3 {
		t.Errorf("status: %+v", infos[0])
	}
	// A program that does not exist: the login shell says so, status 127.
	if err := h.start(Spec{Name: "missing", Argv: []string{"no-such-agent-program"}}); err != nil {
		t.Fatal(err)
	}
	infos = h.waitFor("the second agent has exited", func(in []Info) bool {
		m, ok := Find(in, "missing")
		return ok && m.Exited
	})
	if m, _ := Find(infos, "missing"); m.Status != 127 {
		t.Errorf("missing program: %+v", m)
	}
}

func TestBadSpecsAreRefusedBeforeTheGuest(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Name: "a.b", Argv: []string{"x"}}, `session name "a.b" is not valid`},
		{Spec{Name: "-x", Argv: []string{"x"}}, `session name "-x" is not valid`},
		{Spec{Name: "ok"}, "no agent command"},
		{Spec{Name: "ok", Argv: []string{"x"}, Env: []Var{{"1A", "v"}}}, `"1A" is not an environment variable name`},
		{Spec{Name: "ok", Argv: []string{"x"}, Env: []Var{{"A", "a\x00b"}}}, "NUL"},
	} {
		if _, _, err := Start(tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.spec, err, tc.want)
		}
	}
}

func TestStartErrorsSayWhatToDo(t *testing.T) {
	for code, want := range map[int]string{exitNoTmux: "tmux is not installed", exitNoTmpfs: "no tmpfs", exitNoProgram: "program is not in the guest", 1: "(exit status 1): boom"} {
		if err := StartError(code, "boom\n"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("code %d: %v", code, err)
		}
	}
	if StartError(0, "") != nil {
		t.Error("status 0 is not an error")
	}
}

func TestParseRefusesWhatItDoesNotKnow(t *testing.T) {
	now := time.Unix(1795436800, 0)
	if _, err := Parse("one\ttwo\n", now); err == nil {
		t.Error("a short line was accepted")
	}
	// Dead but not yet reaped: still running; reaped without a status: a
	// signal. The state: the hooks' when they said one (d), else by the
	// output (a printed 10 s ago, e 40 s ago; an unknown state is ignored).
	got, err := Parse("a\t1795436762\t1\t1\t\t\t\t\t1795436790\t\t\t\tcmd\twith tab\n"+
		"b\t1795436762\t0\t1\t\t1795436770\t\t\t1795436770\t\t\t\t\n"+
		"c\t1795436762\t0\t1\t\t\t4\t1795436771\t1795436771\tworking\t\t\tx\n"+
		"d\t1795436762\t0\t0\t\t\t\t\t1795436700\twaiting\t1795436799\tMay I run make?\tclaude\n"+
		"e\t1795436762\t0\t0\t\t\t\t\t1795436760\tbored\t\t\tsh\n", now)
	if err != nil || len(got) != 5 || got[0].Exited || got[0].Command != "cmd\twith tab" || got[0].Attached != 1 ||
		!got[1].Exited || got[1].Status != -1 || got[1].EndedAt == nil ||
		!got[2].Exited || got[2].Status != 4 || got[2].EndedAt.Unix() != 1795436771 {
		t.Fatalf("got %+v, %v", got, err)
	}
	for i, want := range []string{"working output", "exited tmux", "exited tmux", "waiting hooks", "waiting output"} {
		if s := got[i].State + " " + got[i].StateFrom; s != want {
			t.Errorf("%s: state %q, want %q", got[i].Name, s, want)
		}
	}
	if d := got[3]; d.Message != "May I run make?" || d.StateAt == nil || d.StateAt.Unix() != 1795436799 {
		t.Errorf("d: %+v", d)
	}
}

func TestNameFor(t *testing.T) {
	for in, want := range map[string]string{"claude": "claude", "./bin/fake agent.sh": "fake-agent-sh", "/": "agent", "...": "agent"} {
		if got := NameFor(in); got != want || CheckName(got) != nil {
			t.Errorf("NameFor(%q) = %q, want %q", in, got, want)
		}
	}
}

// tmux 3.3a can lose a pane's SIGCHLD while other clients talk to it (its
// pane_dead_status then stays empty): the wrapper's own record must not.
func TestStatusesSurviveABusyServer(t *testing.T) {
	h := newHost(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				h.sh(List(), nil)
			}
		}
	}()
	const n = 20
	for i := range n {
		if err := h.start(Spec{Name: "s" + strconv.Itoa(i), Argv: []string{"sh", "-c", "exit " + strconv.Itoa(i)}}); err != nil {
			close(stop)
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	infos := h.waitFor("every agent has exited", func(in []Info) bool {
		ended := 0
		for _, s := range in {
			if s.Exited {
				ended++
			}
		}
		return ended == n
	})
	for _, s := range infos {
		if want := strings.TrimPrefix(s.Name, "s"); strconv.Itoa(s.Status) != want {
			t.Errorf("%s: status %d", s.Name, s.Status)
		}
	}
}

// Ctrl-C is the agent's (Claude Code cancels a step with it): the wrapper
// outlives it and still records the agent's status.
func TestCtrlCReachesTheAgentNotTheWrapper(t *testing.T) {
	h := newHost(t)
	if err := h.start(Spec{Name: "agent", Argv: []string{"sh", "-c", `trap 'echo interrupted; exit 4' INT; echo waiting; while :; do sleep 0.1; done`}}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the agent waits", func([]Info) bool {
		_, out, _ := h.sh(Scrollback("agent"), nil)
		return strings.Contains(out, "waiting")
	})
	if code, _, errOut := h.sh(tmux("send-keys", "-t", pane("agent"), "C-c"), nil); code != 0 {
		t.Fatal(errOut)
	}
	infos := h.waitFor("the agent has exited", func(in []Info) bool { return len(in) == 1 && in[0].Exited })
	if infos[0].Status != 4 {
		t.Errorf("status after Ctrl-C: %+v (the wrapper died with the agent?)", infos[0])
	}
}

// A start that requires its program looks for it as the session would
// run it (a login shell in the start directory): a missing one is
// ErrNoProgram, with no session and no environment file left; one found
// there, a relative path included, starts.
func TestRequireLooksForTheProgramWhereTheSessionRuns(t *testing.T) {
	h := newHost(t)
	err := h.start(Spec{Name: "missing", Argv: []string{"no-such-agent-program"}, Env: []Var{{"CANARY", "x"}}, Require: true})
	if !errors.Is(err, ErrNoProgram) {
		t.Fatalf("start of a missing program: %v, want ErrNoProgram", err)
	}
	if got := h.list(); len(got) != 0 {
		t.Errorf("a refused start left sessions: %+v", got)
	}
	if ents, _ := os.ReadDir(h.runtime); len(ents) != 0 {
		t.Errorf("a refused start left %v", ents)
	}
	// Relative to the start directory, not to the caller's.
	ws := filepath.Join(h.dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "stand-in"), []byte("#!/bin/sh\nexit 4\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd, stdin, err := Start(Spec{Name: "here", Argv: []string{"./stand-in"}, Dir: ws, Require: true})
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := h.sh(cmd, stdin); StartError(code, errOut) != nil {
		t.Fatalf("start of ./stand-in in %s: %v", ws, StartError(code, errOut))
	}
	infos := h.waitFor("the agent has exited", func(in []Info) bool { return len(in) == 1 && in[0].Exited })
	if infos[0].Status != 4 {
		t.Errorf("status: %+v", infos[0])
	}
	// One that only a login shell finds (its profile puts it on the PATH).
	home := t.TempDir()
	if err := os.Mkdir(filepath.Join(home, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "bin", "login-only-agent"), []byte("#!/bin/sh\nexit 5\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".profile"), []byte("PATH=$HOME/bin:$PATH\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.sh(tmux("kill-server"), nil) // the server's environment is the agent's: a new one with this HOME
	h.env = append(h.env, "HOME="+home)
	if code, _, _ := h.sh("command -v login-only-agent", nil); code == 0 {
		t.Fatal("the test's plain shell finds login-only-agent already")
	}
	if err := h.start(Spec{Name: "login", Argv: []string{"login-only-agent"}, Require: true}); err != nil {
		t.Fatalf("start of a program on the login shell's PATH: %v", err)
	}
	h.waitFor("the login shell's agent has exited", func(in []Info) bool {
		m, ok := Find(in, "login")
		return ok && m.Exited && m.Status == 5
	})
	// A duplicate is told before the program is looked for.
	if err := h.start(Spec{Name: "login", Argv: []string{"no-such-agent-program"}, Require: true}); !errors.Is(err, ErrDuplicate) {
		t.Errorf("second start: got %v, want ErrDuplicate", err)
	}
}
