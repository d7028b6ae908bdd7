package selfcmd

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
)

// mcp-proxy without --token-file is a short usage error, exit 2, with
// the hint of what the file is.
func TestMCPProxyNeedsAToken(t *testing.T) {
	for _, args := range [][]string{{"mcp-proxy"}, {"mcp-proxy", "--listen", "127.0.0.1:0"}} {
		r := run(t, nil, nil, args...)
		if r.code != cmdline.ExitUsage || r.stdout != "" || !strings.HasPrefix(r.stderr, "agent-vm: mcp-proxy needs --token-file (hint: ") || strings.Count(r.stderr, "\n") > 2 {
			t.Errorf("agent-vm %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
		}
	}
}

// open-url's failure paths: no URL (or two) is a usage error, a guest
// whose URL opener is closed is told how to open it.
func TestOpenURLFailures(t *testing.T) {
	noDoor := filepath.Join(t.TempDir(), "open-url.sock")
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"open-url"}, cmdline.ExitUsage, "open-url takes one URL, got 0 arguments"},
		{[]string{"open-url", "https://a.test/", "https://b.test/"}, cmdline.ExitUsage, "open-url takes one URL, got 2 arguments"},
		{[]string{"open-url", "--socket", noDoor, "https://example.test/"}, cmdline.ExitError,
			"agent-vm: opening URLs on the host is off for this VM; on the host, run: agent-vm browser "},
	}
	for _, c := range cases {
		r := run(t, nil, nil, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
			t.Errorf("agent-vm %q: exit %d (want %d)\nstdout:\n%s\nstderr:\n%s", c.args, r.code, c.code, r.stdout, r.stderr)
		}
	}
	if r := run(t, nil, nil, "open-url", "--socket", noDoor, "https://example.test/"); !strings.HasSuffix(r.stderr, " --open-urls\n") {
		t.Errorf("the closed opener's hint:\n%s", r.stderr)
	}
}

// open-url against a real URL opener on a unix socket: an opened URL exits 0, a
// refused one 1 with the host's reason.
func TestOpenURLAsksTheDoor(t *testing.T) {
	// FAKE at the exec boundary: the host's xdg-open.
	xdgOpen := execxtest.New(t).On(bridge.Opener, func(execxtest.Call) execxtest.Reply { return execxtest.Reply{} })
	d := &bridge.URLOpener{VM: "x", Open: true, Run: xdgOpen}
	sock := filepath.Join(t.TempDir(), "open-url.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go d.Serve(context.Background(), c)
		}
	}()
	r := run(t, nil, nil, "open-url", "--socket", sock, "https://example.test/x")
	if r.code != 0 || r.stderr != "agent-vm: opened in the host's browser\n" || r.stdout != "" {
		t.Errorf("an opened URL: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if calls := xdgOpen.Calls(); len(calls) != 1 || calls[0].Args[0] != "https://example.test/x" {
		t.Errorf("the host ran %+v", calls)
	}
	r = run(t, nil, nil, "open-url", "--socket", sock, "file:///etc/passwd")
	if r.code != cmdline.ExitError || !strings.Contains(r.stderr, "agent-vm: the host refused the URL: file: URLs are not opened") {
		t.Errorf("a refused URL: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

// agent-state never fails the agent's hook (exit 0, whatever it is given)
// and says on stderr why it kept nothing: a payload it cannot read, one
// over the bound, no session pane.
func TestAgentStateNeverFailsTheHook(t *testing.T) {
	payload := func(s string) *os.File {
		f, err := os.CreateTemp(t.TempDir(), "payload")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(0, 0); err != nil {
			t.Fatal(err)
		}
		return f
	}
	huge := `{"hook_event_name":"Stop","x":"` + strings.Repeat("x", 1<<20) + `"}`
	for _, c := range []struct {
		in   string
		args []string
		want string
	}{
		{"not json", nil, "the hook's payload is not JSON"},
		{huge, nil, "is over 65536 bytes: ignored"},
		{`{"hook_event_name":"Stop"}`, nil, "$TMUX_PANE is empty"},
		{"", []string{`{"type":"agent-turn-complete"}`}, "$TMUX_PANE is empty"}, // Codex: the payload is the argument
		{"", []string{`{"type":"x"}`}, "says nothing agent-vm reads"},
	} {
		r := run(t, payload(c.in), nil, append([]string{"agent-state"}, c.args...)...)
		if r.code != 0 || r.stdout != "" || !strings.HasPrefix(r.stderr, "agent-vm agent-state: ") || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-state %.40q %q: exit %d\nstdout:\n%s\nstderr:\n%s", c.in, c.args, r.code, r.stdout, r.stderr)
		}
	}
}
