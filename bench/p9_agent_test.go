package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAgentVersion(t *testing.T) {
	for _, tc := range []struct{ out, want string }{
		{"2.1.332 (Claude Code)\n", "2.1.332"},
		{"codex-cli 0.171.0\r\n", "0.171.0"},
		{"v0.61.0\n", "0.61.0"},
		// As tmux draws it on the attached terminal, its status line below.
		{"\x1b[?1049h\x1b[H\x1b[2J\x1b[1;1H2.1.332 (Claude Code)\x1b[K\r\n\x1b[24;1H\x1b[30m\x1b[42m[bench-p9-3 claude] 0:claude*\x1b[39m\x1b[49m \"agent-vm-bench-p9-3\" 10:00 28-Nov-26\x1b[?1049l[detached (from session claude)]\r\n", "2.1.332"},
		// A cursor move is all that separates it from the text before.
		{"claude\x1b[2;1H2.1.332 (Claude Code)", "2.1.332"},
		{"\x1b]0;agent-vm\x07\x1b(B2.1.332", "2.1.332"},
		{"connected to 10.0.2.15 port 22\n", ""},
		{"[detached (from session claude)]\r\n", ""},
		{"version 2.1\n", ""},
		{"", ""},
	} {
		if got := agentVersion(tc.out); got != tc.want {
			t.Errorf("agentVersion(%q) = %q, want %q", tc.out, got, tc.want)
		}
	}
}

func TestHasFlag(t *testing.T) {
	const before = `NAME:
   agent-vm template build - boot and save the template a VM's machine fits

OPTIONS:
   --timeout value  how long to wait for SSH and agent-mcp to answer (default: 5m with KVM, 15m with TCG)
   --help, -h       show help
`
	const after = `OPTIONS:
   --timeout value  how long to wait for SSH and agent-mcp to answer (default: 5m with KVM, 15m with TCG)
   --agents value   agent CLIs to install: all, none, or a comma-separated list of claude, codex, gemini (default: "all")
   --help, -h       show help
`
	for _, tc := range []struct {
		help, name string
		want       bool
	}{
		{before, "agents", false},
		{after, "agents", true},
		{after, "timeout", true},
		{after, "agent", false},
		{"   -a, --agents value  agent CLIs\n", "agents", true},
		{"   --agents-dir value  where\n", "agents", false},
		{"   --timeout value  see --agents\n", "agents", false},
	} {
		if got := hasFlag(tc.help, tc.name); got != tc.want {
			t.Errorf("hasFlag(%q, %q) = %v, want %v", tc.help, tc.name, got, tc.want)
		}
	}
}

// p9Lines are a run's stderr lines with when they arrived, at offsets in
// seconds from began; a JSON log line keeps its own time stamp.
func p9Lines(began time.Time, lines ...any) []stampedLine {
	var out []stampedLine
	for i := 0; i < len(lines); i += 2 {
		at := began.Add(time.Duration(lines[i].(float64) * float64(time.Second)))
		out = append(out, stampedLine{At: at, Text: lines[i+1].(string)})
	}
	return out
}

func TestParseP9Run(t *testing.T) {
	began := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	res := cmdResult{Line: "agent-vm run bench-p9-3", Start: began, End: began.Add(6500 * time.Millisecond),
		Stdout: "\x1b[H\x1b[2J2.1.332 (Claude Code)\x1b[K\r\n"}
	lines := p9Lines(began,
		0.05, "agent-vm: no VM for branch bench-p9-3 yet: creating one",
		0.10, `{"@level":"info","@message":"cloning workspace","@module":"agent-vm","@timestamp":"2026-11-28T10:00:00.100000Z"}`,
		0.45, `{"@level":"info","@message":"created","@module":"agent-vm","@timestamp":"2026-11-28T10:00:00.450000Z","backend":"qemu"}`,
		0.60, "starting from the template (0s)",
		3.10, `{"@level":"debug","@message":"ssh ready","@module":"agent-vm","@timestamp":"2026-11-28T10:00:03.100000Z","after":2500000000}`,
		3.30, "finishing the guest's setup (2s)",
		3.50, "waiting for agent-mcp (3s): no answer on the MCP port (agent-mcp not up yet?)",
		4.00, "waiting for agent-mcp (3s): no answer on the MCP port (agent-mcp not up yet?)",
		5.00, "agent-vm: started session claude in VM bench-p9-3: claude --version",
	)
	p, err := parseP9Run(res, lines)
	if err != nil {
		t.Fatal(err)
	}
	if p.Wall != 6.5 || math.Abs(p.Create-0.40) > 1e-9 || p.Path != "from the saved template" || p.Version != "2.1.332" || p.Installed {
		t.Errorf("parseP9Run = %+v", p)
	}
	want := "create 0.1 s, starting from the template 0.6 s, ssh ready 3.1 s, finishing the guest's setup 3.3 s, waiting for agent-mcp 3.5 s, session 5.0 s, exit 6.5 s"
	if p.Phases != want {
		t.Errorf("phases %q, want %q", p.Phases, want)
	}

	// A cold boot that installs the agent itself.
	cold := p9Lines(began,
		0.05, "agent-vm: no VM for branch bench-p9-4 yet: creating one",
		0.40, `{"@level":"info","@message":"created","@module":"agent-vm","@timestamp":"2026-11-28T10:00:00.400000Z"}`,
		0.50, `{"@level":"info","@message":"booting cold, not from a template: no template fits its machine","@module":"agent-vm","@timestamp":"2026-11-28T10:00:00.500000Z"}`,
		0.60, "starting the VM (qemu) (0s)",
		90.0, "agent-vm: installing claude in VM bench-p9-4 (npm @anthropic-ai/claude-code@2.1.332; a few minutes without KVM)",
	)
	res.End = began.Add(300 * time.Second)
	p, err = parseP9Run(res, cold)
	if err != nil {
		t.Fatal(err)
	}
	if p.Path != "cold first boot (not from a template: no template fits its machine)" || !p.Installed {
		t.Errorf("a cold run read as %+v", p)
	}

	// A template refused once started from: the cold boot wins.
	refused := append(p9Lines(began, 0.05, "agent-vm: no VM for branch x yet: creating one", 0.6, "starting from the template (0s)"),
		p9Lines(began, 0.4, `{"@level":"info","@message":"created","@timestamp":"2026-11-28T10:00:00.400000Z"}`,
			1.0, `{"@level":"warn","@message":"booting cold, not from the template: another QEMU","@timestamp":"2026-11-28T10:00:01Z"}`)...)
	if p, err := parseP9Run(res, refused); err != nil || p.Path != "cold first boot (not from the template: another QEMU)" {
		t.Errorf("a refused template read as %+v, %v", p, err)
	}

	for name, bad := range map[string]struct {
		stdout string
		lines  []stampedLine
	}{
		"no version":     {"[detached (from session claude)]\r\n", lines},
		"no create line": {res.Stdout, lines[3:]},
	} {
		if _, err := parseP9Run(cmdResult{Line: "agent-vm run x", Stdout: bad.stdout, Start: began, End: began.Add(time.Second)}, bad.lines); err == nil {
			t.Errorf("%s: parseP9Run succeeded, want an error", name)
		}
	}
}

// A real run from a template (2026-11-27, TCG, agent-vm of 510e93d), of
// `run p9run1 --agent bash -- --version` with stdin an open pipe:
// tmux's drawing of the terminal on stdout, progress and JSON logs on
// stderr. A JSON log line is given as arriving at its time stamp, any
// other 1 ms after the line before.
func TestParseP9RunReal(t *testing.T) {
	stdout, err := os.ReadFile(filepath.Join("testdata", "run-version.stdout"))
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := os.ReadFile(filepath.Join("testdata", "run-version.stderr"))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Date(2026, 11, 27, 6, 51, 15, 900000000, time.UTC)
	var lines []stampedLine
	at := began
	for _, l := range strings.Split(strings.TrimSuffix(string(stderr), "\n"), "\n") {
		var log struct {
			Timestamp time.Time `json:"@timestamp"`
		}
		if json.Unmarshal([]byte(l), &log) == nil {
			at = log.Timestamp
		}
		lines = append(lines, stampedLine{At: at, Text: l})
		at = at.Add(time.Millisecond)
	}
	res := cmdResult{Line: "agent-vm run p9run1", Stdout: string(stdout), Stderr: string(stderr), Start: began, End: began.Add(16400 * time.Millisecond)}
	p, err := parseP9Run(res, lines)
	if err != nil {
		t.Fatal(err)
	}
	if p.Version != "5.2.15" || p.Path != "from the saved template" || p.Installed || math.Abs(p.Create-0.0723) > 1e-6 {
		t.Errorf("parseP9Run = %+v", p)
	}
	want := "create 0.0 s, creating the VM's disk 0.1 s, starting from the template 0.1 s, restored 1.1 s, identity 4.5 s, ssh ready 5.2 s, workspace mounted 12.4 s, finishing the guest's setup 12.4 s, session 12.4 s, exit 16.4 s"
	if p.Phases != want {
		t.Errorf("phases %q, want %q", p.Phases, want)
	}
}
