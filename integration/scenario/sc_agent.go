package scenario

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/integration/harness"
)

func agentCLIScenario() harness.Scenario {
	return harness.Scenario{
		Name: "agent-cli",
		Summary: "an agent on a new branch in seconds: a VM starts from the run's template, where template build --agents claude installed the real Claude Code from npm; " +
			"run NEWBRANCH --agent claude -- --version starts from it and prints the version with no request to npm (net log); run --chrome; without the host's pins, " +
			"run --agent gemini's install from npm is refused, and agent-vm says why and what lifts it; a rebuild replaces the template and the VMs on the old one run on (no API call)",
		NeedsVM: true,
		// Templates are the qemu backend's (a saved QEMU machine).
		Backends: []string{"qemu"},
		Template: "claude",
		Verbs:    []string{"create", "template", "setup", "run", "net", "start", "exec", "status", "destroy", "browser"},
		Run:      runAgentCLI,
	}
}

const (
	agentBranch    = "itest/agent-cli"
	agentNewBranch = "itest/agent-cli-new"
)

// claudeVersion is `claude --version`'s answer among the terminal's
// drawing.
var claudeVersion = regexp.MustCompile(`[0-9]+\.[0-9]+\.[0-9]+ \(Claude Code\)`)

// templateBuilt is `template build`'s first line on stdout.
var templateBuilt = regexp.MustCompile(`(?m)^built template (\S+) in `)

// runAgentCLI works with the run's template (sc_template.go), which holds
// Claude Code: its new branch runs Claude Code from it, and it rebuilds
// it last (the template scenario was the first build), checking that the
// rebuild replaces it while the VMs started from it run on. The scenarios
// that start from the run's template come before it. Nothing here calls
// the agent's API: no key is available on these machines.
func runAgentCLI(ctx context.Context, s *harness.S) {
	var rp *harness.Repo
	var old string
	tcall := func(args ...string) *harness.Result {
		return s.Call(ctx, harness.Call{Args: args, Dir: rp.Dir})
	}
	s.Step(ctx, "make a git repo and create a VM; bad agent names are refused before anything is made", func() (err error) {
		if rp, err = harness.NewRepo(ctx, s.Dir(), nil); err != nil {
			return err
		}
		res := s.TryCreate(ctx, rp.Dir, "--agent", "clippy", agentBranch+"-x")
		if err := harness.Want(res, 1); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, `"clippy"`) || !strings.Contains(res.Stderr, "claude, codex, gemini") {
			return harness.Failf(res, "the refusal does not name the input and the known agents")
		}
		for _, tc := range []struct{ agents, says string }{
			{"clippy", `"clippy" is not an agent agent-vm knows`},
			{"claude@^2", `"^2" is not a version of claude`},
		} {
			res := tcall("template", "build", agentBranch, "--agents", tc.agents)
			if err := harness.Want(res, 1); err != nil {
				return err
			}
			if !strings.Contains(res.Stderr, tc.says) {
				return harness.Failf(res, "the refusal of --agents %s does not say %q", tc.agents, tc.says)
			}
		}
		_, err = s.Create(ctx, rp.Dir, agentBranch)
		return err
	})
	// The VM was made by create with no flags: the default machine.
	s.Step(ctx, "the VM's first start is from the run's template", func() error {
		ts, err := templates(ctx, s)
		if err != nil {
			return err
		}
		if len(ts) != 1 || !ts[0].Ready {
			return harness.Failf(s.LastResult(), "template list: want the run's template alone, ready")
		}
		old = ts[0].Slug
		res, err := s.Boot(ctx, "start", agentBranch)
		if err != nil {
			return err
		}
		if !strings.Contains(res.Stdout, "from its template") {
			return harness.Failf(res, "start did not start the VM from the template")
		}
		return nil
	})
	// The run's template (sc_template.go) holds Claude Code: built by
	// `template build --agents claude` once for the run.
	s.Step(ctx, "run NEWBRANCH --agent claude -- --version starts from the template and prints the version, with no request to npm", func() error {
		kbd, err := harness.NewKeyboard() // run attaches; the agent ends by itself
		if err != nil {
			return err
		}
		defer kbd.Close()
		res := s.Call(ctx, harness.Call{Args: []string{"run", agentNewBranch, "--agent", "claude", "--", "--version"}, Dir: rp.Dir, Stdin: kbd.File})
		s.Register(agentNewBranch, rp.Dir)
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		version := claudeVersion.FindString(res.Stdout)
		if version == "" {
			return harness.Failf(res, "the terminal did not show claude's version")
		}
		if !strings.Contains(res.Stderr, "starting from the template") || strings.Contains(res.Stderr, "installing claude") {
			return harness.Failf(res, "run did not start the new VM from the template with claude installed")
		}
		hosts := func() ([]string, error) {
			log := s.Call(ctx, harness.Call{Args: []string{"net", "log", "--json", agentNewBranch}, Dir: rp.Dir})
			if err := harness.Want(log, 0); err != nil {
				return nil, err
			}
			var out []string
			dec := json.NewDecoder(strings.NewReader(log.Stdout))
			for dec.More() {
				var e struct {
					Host string `json:"host"`
				}
				if err := dec.Decode(&e); err != nil {
					return nil, harness.Failf(log, "net log --json: %v", err)
				}
				out = append(out, e.Host)
			}
			return out, nil
		}
		seen, err := hosts()
		if err != nil {
			return err
		}
		if slices.Contains(seen, "registry.npmjs.org") {
			return harness.Failf(s.LastResult(), "the guest asked npm's registry for something during the run")
		}
		s.Notef("%s", version)
		// The log does see a request to npm's registry when there is one
		// (whether the proxy lets it through here or not).
		_ = s.Exec(ctx, agentNewBranch, "curl", "-sS", "-o", "/dev/null", "--max-time", "30", "https://registry.npmjs.org/")
		if seen, err = hosts(); err != nil {
			return err
		}
		if !slices.Contains(seen, "registry.npmjs.org") {
			return harness.Failf(s.LastResult(), "net log does not show a request to npm's registry made on purpose: the check above proves nothing")
		}
		// A program the guest lacks, which is no known agent either.
		bad := s.Call(ctx, harness.Call{Args: []string{"run", agentNewBranch, "--agent", "no-such-tool"}, Dir: rp.Dir, Stdin: kbd.File})
		if err := harness.Want(bad, 1); err != nil {
			return err
		}
		if !strings.Contains(bad.Stderr, "has no program no-such-tool") || !strings.Contains(bad.Stderr, "claude, codex, gemini") {
			return harness.Failf(bad, "run --agent no-such-tool does not say the VM lacks it and which agents run installs")
		}
		return nil
	})
	s.Step(ctx, "the template's chrome-devtools-mcp is in the VM; run --chrome: with no bridge socket it says what to do and what it fell back to; with one, claude starts with --chrome", func() error {
		return checkRunChrome(ctx, s, rp.Dir)
	})
	s.Step(ctx, "without the pins, run --agent gemini's install from npm is refused, and agent-vm says why and what lifts it", func() error {
		return checkRefusedInstall(ctx, s, rp.Dir)
	})
	s.Step(ctx, "template build again replaces the template; the VMs on the old one run on; setup --template finds the new one current", func() error {
		res := tcall("template", "build", agentBranch, "--agents", "none")
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		m := templateBuilt.FindStringSubmatch(res.Stdout)
		if m == nil || !strings.Contains(res.Stdout, "it replaces template "+old) {
			return harness.Failf(res, "template build did not say it replaces %s", old)
		}
		ts, err := templates(ctx, s)
		if err != nil {
			return err
		}
		found := 0
		for _, t := range ts {
			switch {
			case t.Slug == m[1] && t.Ready && len(t.Stale) == 0:
				found++
			case t.Slug == old && !t.Ready && t.UsedBy == 2:
				found++
			}
		}
		if found != 2 || len(ts) != 2 {
			return harness.Failf(s.LastResult(), "template list: want the new template (current) and the old one's disk kept for the two VMs on it")
		}
		if _, err := s.ExecOK(ctx, agentBranch, "sh", "-c", "echo still-here > /home/dev/probe && sync && cat /home/dev/probe"); err != nil {
			return err
		}
		res = tcall("setup", "--yes", "--template", "--agents", "none")
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		if !strings.Contains(res.Stdout, "the default machine's template "+m[1]+" is current") {
			return harness.Failf(res, "setup --template did not find the new template current")
		}
		return nil
	})
	s.Step(ctx, "destroy both; template rm all leaves no template", func() error {
		for _, b := range []string{agentNewBranch, agentBranch} {
			if res := s.Call(ctx, harness.Call{Args: []string{"destroy", "--force", b}, Dir: rp.Dir}); harness.Want(res, 0) != nil {
				return harness.Want(res, 0)
			}
		}
		if err := harness.Want(tcall("template", "rm", "all"), 0); err != nil {
			return err
		}
		ts, err := templates(ctx, s)
		if err != nil {
			return err
		}
		if len(ts) > 0 {
			return harness.Failf(s.LastResult(), "template rm all left %d templates", len(ts))
		}
		return nil
	})
}

// templateInfo is one template of `template list --json`.
type templateInfo struct {
	Slug   string            `json:"slug"`
	Ready  bool              `json:"ready"`
	Agents map[string]string `json:"agents"`
	UsedBy int               `json:"used_by"`
	Stale  []string          `json:"stale"`
}

// templates is `template list --json` (the run's templates).
func templates(ctx context.Context, s *harness.S) ([]templateInfo, error) {
	res := s.Call(ctx, harness.Call{Args: []string{"template", "list", "--json"}})
	if err := harness.Want(res, 0); err != nil {
		return nil, err
	}
	var ts []templateInfo
	if err := json.Unmarshal([]byte(res.Stdout), &ts); err != nil {
		return nil, harness.Failf(res, "template list --json: %v", err)
	}
	return ts, nil
}

// checkRefusedInstall: the running NEWBRANCH VM's policy is written again
// (a `net allow`) by an agent-vm whose configuration directory is empty,
// so it has no pins; then `run --agent gemini` (the run's template has no
// gemini) installs it from npm and fails, and agent-vm's error says what
// the VM's proxy refused: npm's registry, why (its address), and the fixes
// (setup, net allow). On a host whose resolver answers npm's registry with
// an address the proxy reaches there is nothing to refuse: the step says
// so and checks nothing. The host's pins stay as they are.
func checkRefusedInstall(ctx context.Context, s *harness.S, dir string) error {
	d, err := doctorJSON(ctx, s, nil)
	if err != nil || !d.pinned("registry.npmjs.org") {
		s.Notef("npm's registry resolves here to an address the proxy reaches: nothing to refuse")
		return err
	}
	empty, err := s.TempDir("config-")
	if err != nil {
		return err
	}
	if res := s.Call(ctx, harness.Call{Args: []string{"net", "allow", "--vm", agentNewBranch, "example.org"}, Dir: dir, Env: []string{"XDG_CONFIG_HOME=" + empty}}); harness.Want(res, 0) != nil {
		return harness.Want(res, 0)
	}
	kbd, err := harness.NewKeyboard()
	if err != nil {
		return err
	}
	defer kbd.Close()
	res := s.Call(ctx, harness.Call{Args: []string{"run", agentNewBranch, "--agent", "gemini", "--", "--version"}, Dir: dir, Stdin: kbd.File})
	if err := harness.Want(res, 1); err != nil {
		return err
	}
	for _, w := range []string{"installing gemini in VM", "the VM's egress proxy refused meanwhile:",
		"registry.npmjs.org:443: the name is allowed, but registry.npmjs.org resolves to ", "agent-vm setup (it pins registry.npmjs.org",
		", or agent-vm net allow "} {
		if !strings.Contains(res.Stderr, w) {
			return harness.Failf(res, "run's error does not say %q", w)
		}
	}
	if strings.Contains(res.Stdout+res.Stderr, "E502") {
		return harness.Failf(res, "npm met a 502, which it retries, not the proxy's refusal")
	}
	return nil
}
