package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/bench/report"
)

// P9 is what a user waits for when they run an agent on a new branch:
// `agent-vm run NEWBRANCH --agent claude -- --version` on a host with a
// template that holds claude, from running it until it has printed the
// agent's version and exited. It is create, a start from the template,
// the agent's session in tmux, the agent itself and the terminal
// attached to it.

// p9Agent is the agent P9 runs; p9Timeout bounds its template build (a
// cold boot and the agent's npm install, about 5 minutes under TCG) and
// each run (one that finds no template boots cold and installs the agent
// itself).
const (
	p9Agent   = "claude"
	p9Timeout = 40 * time.Minute
)

// p9FullStart are the agent's arguments for the reference: --version
// with another argument. Claude Code answers a lone --version before it
// loads the rest of itself (0.2-0.4 s under TCG, measured 2026-12-02),
// and with any other argument only after (3.0-3.8 s in the same VM);
// run's session always gives it one (its hooks, --settings), so a lone
// --version would count the agent's own start as run's.
var p9FullStart = []string{"--settings", "{}", "--version"}

// runP9 builds a template with the agent (not timed), then, per round,
// runs the agent's --version on a new branch; the reference, paired, is
// `exec VM -- claude --settings {} --version` in the same VM right after
// (the agent's own full start on this machine, plus an exec), so the
// difference is what run adds. Each round's VM is stopped before the
// next one starts.
func runP9(ctx context.Context, l *lab, f *report.Figure) error {
	agents, err := templateAgents(ctx, l.av)
	if err != nil {
		return err
	}
	if !agents {
		f.Skipped = "this agent-vm's `template build` has no --agents flag, so no template holds an agent CLI"
		l.log.Printf("%s: skipped: %s", f.ID, f.Skipped)
		return nil
	}
	if err := l.stopAll(ctx); err != nil {
		return err
	}
	// A template the lab built before (P1' builds one) is of the same
	// machine: an agent-vm that does not replace it would refuse a build.
	if err := l.removeTemplates(ctx); err != nil {
		return err
	}
	from, err := l.newVM(ctx, "p9t")
	if err != nil {
		return err
	}
	// The template's npm install goes through its VM's egress proxy,
	// which refuses a name that resolves to a non-global address unless
	// that address is allowed: some networks (CI's) answer every name
	// with such an address. Where the registry resolves to public
	// addresses this changes nothing.
	addrs, err := net.DefaultResolver.LookupHost(ctx, "registry.npmjs.org")
	if err != nil {
		return fmt.Errorf("resolving registry.npmjs.org for the template's npm install: %w", err)
	}
	if res := l.av.run(ctx, quickTimeout, append([]string{"net", "allow", "--vm", from.name}, addrs...)...); res.Err != nil {
		return res.Err
	}
	if err := l.buildTemplate(ctx, f, p9Timeout, from.name, "--agents", p9Agent); err != nil {
		return err
	}
	var runs, refs []float64
	for r := 1; r <= l.cfg.Rounds; r++ {
		run, ref, err := p9Round(ctx, l, f, r)
		if err != nil {
			f.Errors = append(f.Errors, fmt.Sprintf("round %d: %v", r, err))
			run, ref = math.NaN(), math.NaN()
		}
		runs, refs = append(runs, run), append(refs, ref)
		if err := l.stopAll(ctx); err != nil {
			return err
		}
	}
	row := report.NewRow("P9", "new branch: `run BRANCH --agent claude -- --version` until it has printed the version and exited (template with claude)", "s",
		report.NewSeries("agent-vm run", runs), report.Ref("`exec VM -- claude --settings {} --version` in the same VM, right after", refs), true)
	row.Note = "goal: 10 s or less"
	f.Rows = []*report.Row{row}
	f.Notes = append(f.Notes,
		"Subject: `agent-vm run NEWBRANCH --agent claude -- --version` (with the lab's create flags: its repository, size and MCP port) from its start to its exit, its output holding the version; stdin is a pipe kept open, as the integration tests drive run (agent-vm gives the guest's side a PTY either way). Per round: create (from the \"creating one\" notice to create's log line), the path start took, and when run's phases began, from run's start.",
		"The reference is the agent's own floor under this accelerator: the same CLI started by `exec` in the same, running VM, with an argument besides --version as run's session gives it one (its hooks), since Claude Code answers a lone --version before loading the rest of itself (the notes give that time too); difference = what run adds (create, start, the tmux session and the attached terminal).")
	return nil
}

// p9Round is one round: a run on a new branch and the reference in its VM.
func p9Round(ctx context.Context, l *lab, f *report.Figure, r int) (run, ref float64, err error) {
	v, flags, err := l.vmFlags(ctx, "p9")
	if err != nil {
		return 0, 0, err
	}
	// The keyboard: a pipe that stays open (an end of input would end the
	// SSH session), given to agent-vm as its stdin directly.
	kbd, keys, err := os.Pipe()
	if err != nil {
		return 0, 0, err
	}
	defer kbd.Close()
	defer keys.Close()
	var lines []stampedLine
	args := append([]string{"--verbose", "--log-format", "json", "run", v.name, "--agent", p9Agent}, flags...)
	spec := l.av.spec(p9Timeout, nil, append(args, "--", "--version")...)
	spec.Stdin = kbd
	spec.OnLine = func(s string) { lines = append(lines, stampedLine{At: time.Now(), Text: s}) }
	l.log.Printf("%s round %d/%d: agent-vm run %s --agent %s -- --version", f.ID, r, l.cfg.Rounds, v.name, p9Agent)
	res := runCmd(ctx, spec)
	v.running, v.noOverlay = true, true // a run that failed may leave QEMU running; stop will see
	if res.Err != nil {
		return 0, 0, res.Err
	}
	v.booted = true
	p, err := parseP9Run(res, lines)
	if err != nil {
		return 0, 0, err
	}
	fast := l.av.run(ctx, quickTimeout, "exec", v.name, "--", p9Agent, "--version")
	if fast.Err != nil {
		return 0, 0, fast.Err
	}
	if got := agentVersion(fast.Stdout); got != p.Version {
		return 0, 0, fmt.Errorf("run showed %s %q, but `exec -- %s --version` printed %q", p9Agent, p.Version, p9Agent, strings.TrimSpace(fast.Stdout))
	}
	e := l.av.run(ctx, quickTimeout, append([]string{"exec", v.name, "--", p9Agent}, p9FullStart...)...)
	if e.Err != nil {
		return 0, 0, e.Err
	}
	if got := agentVersion(e.Stdout); got != p.Version {
		return 0, 0, fmt.Errorf("run showed %s %q, but `exec -- %s %s` printed %q", p9Agent, p.Version, p9Agent, strings.Join(p9FullStart, " "), strings.TrimSpace(e.Stdout))
	}
	f.Notes = append(f.Notes, fmt.Sprintf("%s: run %.1f s (%s %s), exec %.2f s (%s alone: %.2f s); create %.1f s; start: %s; %s",
		v.name, p.Wall, p9Agent, p.Version, e.Seconds(), "--version", fast.Seconds(), p.Create, p.Path, p.Phases))
	switch {
	case p.Path != "from the saved template":
		return 0, 0, fmt.Errorf("%s did not start from the template holding %s: %s (not a sample)", v.name, p9Agent, p.Path)
	case p.Installed:
		return 0, 0, fmt.Errorf("%s: run installed %s from npm although the template holds it (not a sample)", v.name, p9Agent)
	}
	return p.Wall, e.Seconds(), nil
}

// templateAgents reports whether `agent-vm template build` takes
// --agents: a template then holds agent CLIs.
func templateAgents(ctx context.Context, a *agentVM) (bool, error) {
	res := a.run(ctx, quickTimeout, "template", "build", "--help")
	if res.Err != nil {
		return false, res.Err
	}
	return hasFlag(res.Stdout, "agents"), nil
}

// hasFlag reports whether a command's --help lists --name.
func hasFlag(help, name string) bool {
	return regexp.MustCompile(`(?m)^\s+(?:-\S+, )*--` + regexp.QuoteMeta(name) + `(?:[\s=,]|$)`).MatchString(help)
}

// stampedLine is a line of a program's stderr and when it arrived.
type stampedLine struct {
	At   time.Time
	Text string
}

// p9Run is what one `run` took and showed.
type p9Run struct {
	Wall   float64 // from its start to its exit
	Create float64 // from the "creating one" notice to create's "created" log line
	// Path is the path its start took: from the saved template, or a
	// cold first boot and why.
	Path string
	// Phases is when each phase began, from run's start, e.g. "starting
	// from the template 0.4 s, ssh ready 3.1 s, session 5.0 s".
	Phases string
	// Installed: run installed the agent's CLI itself.
	Installed bool
	Version   string // the agent's, as the terminal showed it
}

// progressLine is a phase line of agent-vm's progress on a pipe:
// "PHASE (ELAPSED)" or "PHASE (ELAPSED): DETAIL".
var progressLine = regexp.MustCompile(`^([a-z][^(:]*?) \((?:\d+h)?(?:\d+m)?\d+s\)(?::|$)`)

// parseP9Run reads a finished run: its stderr lines as they came (with
// --verbose --log-format json, its logs are JSON with their own time
// stamps) and the terminal's output on stdout.
func parseP9Run(res cmdResult, lines []stampedLine) (p9Run, error) {
	p := p9Run{Wall: res.Seconds(), Path: "cold first boot", Version: agentVersion(res.Stdout)}
	if p.Version == "" {
		return p, fmt.Errorf("`%s` showed no version on the terminal; its output ends: %q", res.Line, tail(stripTerminal(res.Stdout), 3))
	}
	type mark struct {
		what string
		at   time.Time
	}
	var phases []mark
	phase := func(what string, at time.Time) { phases = append(phases, mark{what, at}) }
	var creating, created time.Time
	last := ""
	for _, l := range lines {
		var log struct {
			Message   string    `json:"@message"`
			Timestamp time.Time `json:"@timestamp"`
		}
		if json.Unmarshal([]byte(l.Text), &log) == nil && log.Message != "" {
			switch what, ok := p9Logged[log.Message]; {
			case log.Message == "created":
				created = log.Timestamp
			case ok:
				phase(what, log.Timestamp)
			case strings.HasPrefix(log.Message, "booting cold"):
				p.Path = "cold first boot (" + strings.TrimPrefix(strings.TrimPrefix(log.Message, "booting cold"), ", ") + ")"
			}
			continue
		}
		text := strings.TrimSpace(l.Text)
		switch {
		case strings.Contains(text, "creating one"):
			creating = l.At
			phase("create", l.At)
		case strings.HasPrefix(text, "agent-vm: installing "+p9Agent):
			p.Installed = true
			phase("npm install", l.At)
		case strings.HasPrefix(text, "agent-vm: started session"):
			phase("session", l.At)
		}
		if m := progressLine.FindStringSubmatch(text); m != nil && m[1] != last {
			last = m[1]
			phase(m[1], l.At)
			if m[1] == "starting from the template" && !strings.HasPrefix(p.Path, "cold first boot (") {
				p.Path = "from the saved template"
			}
		}
	}
	if creating.IsZero() || created.IsZero() {
		return p, fmt.Errorf("`%s` did not say it created the VM (no \"creating one\" notice or \"created\" log line); stderr ends: %s", res.Line, tail(res.Stderr, 3))
	}
	p.Create = created.Sub(creating).Seconds()
	phase("exit", res.End)
	slices.SortStableFunc(phases, func(a, b mark) int { return a.at.Compare(b.at) })
	var said []string
	for _, m := range phases {
		said = append(said, fmt.Sprintf("%s %.1f s", m.what, m.at.Sub(res.Start).Seconds()))
	}
	p.Phases = strings.Join(said, ", ")
	return p, nil
}

// p9Logged are the debug log lines of a start that P9's phases show, and
// what they call them.
var p9Logged = map[string]string{
	"restored the template's machine": "restored",
	"the guest has its identity":      "identity",
	"ssh ready":                       "ssh ready",
	"the workspace is mounted":        "workspace mounted",
}

// terminalControl matches a terminal's control sequences: CSI, OSC and
// DCS strings, and two-byte escapes (character sets, keypad modes).
var terminalControl = regexp.MustCompile(`\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]P_^][^\x07\x1b]*(?:\x07|\x1b\\)|[()*+][0-9A-Za-z]|[=>78DEHMNOZc])|[\r\x07\x0e\x0f]`)

// stripTerminal is what a terminal's output says, its control sequences
// replaced by spaces (a cursor move may separate two words).
func stripTerminal(out string) string {
	return terminalControl.ReplaceAllString(out, " ")
}

// versionRE is a version as agent CLIs print it (claude "2.1.332 (Claude
// Code)", codex "codex-cli 0.171.0"), not part of a longer dotted number
// such as an IP address.
var versionRE = regexp.MustCompile(`(?:^|[^\w.])v?(\d+\.\d+\.\d+)(?:[^\w.]|$)`)

// agentVersion is the first version in a terminal's output, "" if none.
func agentVersion(out string) string {
	m := versionRE.FindStringSubmatch(stripTerminal(out))
	if m == nil {
		return ""
	}
	return m[1]
}
