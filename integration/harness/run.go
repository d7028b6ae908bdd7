package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// Run runs the selected scenarios against the agent-vm binary and returns
// the exit code: 0 all passed, 1 any failed, 2 a usage mistake, 130
// interrupted (ctx cancelled, by SIGINT or SIGTERM). Whatever happens, it
// stops and destroys the VMs it started and removes its temporary
// directories before it returns, except what --keep keeps of a failed
// scenario.
func Run(ctx context.Context, cfg Config, suite Suite) int {
	cfg = withDefaults(cfg)
	rep := &reporter{w: cfg.Stdout, color: colorOn(cfg),
		live: cfg.IsTerminal, width: cfg.TermWidth, verbose: cfg.Verbose, now: time.Now}

	selected := selectScenarios(suite.Scenarios, cfg.Run)
	if cfg.List {
		listScenarios(rep, suite.Scenarios)
		return ExitPassed
	}
	if len(selected) == 0 {
		fmt.Fprintf(cfg.Stderr, "integration-test: no scenario matches --run %q (the scenarios: %s; `integration-test --list` describes them)\n",
			cfg.Run.String(), strings.Join(names(suite.Scenarios), ", "))
		return ExitUsage
	}
	bin, err := findAgentVM(cfg)
	if err != nil {
		fmt.Fprintf(cfg.Stderr, "integration-test: %v\n", err)
		return ExitFailed
	}
	root, err := os.MkdirTemp("", "agent-vm-itest-")
	if err != nil {
		fmt.Fprintf(cfg.Stderr, "integration-test: making a temporary directory: %v\n", err)
		return ExitFailed
	}
	r := &run{cfg: cfg, rep: rep, root: root, ctx: ctx, template: suite.Template}
	return r.main(selected, bin)
}

// Suite is what the binary runs: the scenarios, in the order they run,
// and the scenario that builds the run's template (template.go) with the
// agents asked for ("none", or an agent CLI's name).
type Suite struct {
	Scenarios []Scenario
	Template  func(agents string) Scenario
}

// run is one invocation's state.
type run struct {
	cfg      Config
	rep      *reporter
	root     string          // the run's temporary directory
	ctx      context.Context // cancelled on SIGINT/SIGTERM
	av       *agentVM
	host     host
	ownState bool // the state directory is the run's own, inside root
	kept     bool // a failed scenario's files are kept (--keep)
	template func(agents string) Scenario

	passed, failed, skipped int
}

func (r *run) interrupted() bool { return r.ctx.Err() != nil }

func (r *run) main(selected []Scenario, bin string) int {
	begin := time.Now()
	stateDir := r.cfg.StateDir
	if stateDir == "" {
		stateDir, r.ownState = filepath.Join(r.root, "state"), true
	} else if abs, err := filepath.Abs(stateDir); err == nil {
		stateDir = abs
	}
	runCtx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	stopNotice := context.AfterFunc(r.ctx, func() {
		r.rep.print("\n" + r.rep.style(styleYellow+styleBold, "interrupted:") +
			" stopping the VMs this run started and removing its files (interrupt again to leave them)\n")
	})
	defer stopNotice()

	watch := blackbox.NewWatch(r.cfg.Stall, func() []string { return consoles(stateDir, r.root) })
	// The watch samples until the run's last cleanup is over, interrupted or not.
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(r.ctx))
	defer stopWatch()
	watch.Start(watchCtx)
	r.av = &agentVM{bin: bin, stateDir: stateDir, env: append(childEnv(), templateDirEnv+"="+templateDir(r.root)), dir: r.root,
		watch: watch, grace: time.Minute, rep: r.rep}
	r.rep.title("agent-vm integration test")
	var err error
	// The run's template may join the selection once the host is known
	// (withTemplate): its commands are asked about too.
	r.host, err = probeHost(runCtx, r.av, verbsOf(append(slices.Clone(selected), r.template("none"))))
	if err != nil {
		return r.abort(err, len(selected))
	}
	selected = withTemplate(selected, r.backend(), r.template)
	r.header(bin, selected)
	for _, sc := range selected {
		r.scenario(runCtx, sc)
	}
	r.finish()
	r.rep.printf("\nfinished in %s\n", fmtDuration(time.Since(begin)))
	r.rep.summary(r.passed, r.failed, r.skipped)
	switch {
	case r.interrupted():
		return ExitInterrupted
	case r.failed > 0:
		return ExitFailed
	}
	return ExitPassed
}

// abort ends a run that could not start its n scenarios: they count as
// skipped, and the failure to start as one failure.
func (r *run) abort(err error, n int) int {
	code := ExitInterrupted
	if !r.interrupted() {
		code, r.failed = ExitFailed, 1
		r.rep.print(r.rep.style(styleRed, "error: ") + err.Error() + "\n")
		var se *stepError
		if errors.As(err, &se) && se.res != nil {
			r.rep.command(se.res, true)
		}
	}
	r.finish()
	r.skipped += n
	r.rep.summary(r.passed, r.failed, r.skipped)
	return code
}

func (r *run) header(bin string, selected []Scenario) {
	r.rep.headerLine("agent-vm", fmt.Sprintf("%s (%s)", bin, r.host.version))
	if r.ownState {
		r.rep.headerLine("state dir", r.av.stateDir+" (fresh, removed at the end)")
	} else {
		r.rep.headerLine("state dir", r.av.stateDir+" (yours: only the VMs this run makes are removed)")
	}
	for i, l := range r.host.describe() {
		key := ""
		if i == 0 {
			key = "host"
		}
		r.rep.headerLine(key, l)
	}
	if r.cfg.Backend != "" {
		r.rep.headerLine("backend", r.cfg.Backend)
	}
	if r.cfg.Host != "" {
		r.rep.headerLine("placed on", "host "+r.cfg.Host+" (create --host)")
	}
	if blackbox.Strict(r.cfg.Getenv) {
		r.rep.headerLine("strict", blackbox.StrictEnv+"=1: a scenario this host cannot run counts as failed")
	}
	r.rep.headerLine("scenarios", strings.Join(names(selected), ", "))
}

// scenario runs one scenario and cleans up after it.
func (r *run) scenario(ctx context.Context, sc Scenario) {
	if r.interrupted() {
		r.skipped++
		return
	}
	r.rep.scenario(sc.Name, sc.Summary)
	if reason := r.skipReason(sc); reason != "" {
		if blackbox.Strict(r.cfg.Getenv) {
			r.rep.step(MarkFail, "cannot run here ("+blackbox.StrictEnv+"=1)", 0, "")
			r.rep.detail(reason)
			r.failed++
			return
		}
		r.rep.skip(reason)
		r.skipped++
		return
	}
	// Each scenario's agent-vm reads a settings file of its own (none
	// until the scenario writes it: UserConfig), never the user's.
	av, dir := *r.av, filepath.Join(r.root, sc.Name)
	av.env = append(slices.Clone(av.env), userConfigEnv+"="+filepath.Join(dir, "config.toml"))
	s := &S{name: sc.Name, av: &av, rep: r.rep, dir: dir, backend: r.cfg.Backend, host: r.cfg.Host,
		vm: sc.NeedsVM, interrupted: r.interrupted, testHooks: strings.HasSuffix(r.host.version, " +testhooks")}
	if r.host.doctor != nil {
		s.sources = r.host.doctor.PackageSources
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		r.rep.step(MarkFail, "make the scenario's directory", 0, err.Error())
		r.failed++
		return
	}
	sc.Run(ctx, s)

	if s.failed && r.cfg.Keep {
		s.keep(context.WithoutCancel(ctx))
		r.kept = true
	} else {
		r.cleanupScenario(s)
	}
	switch {
	case s.failed:
		r.failed++
	case r.interrupted():
		r.skipped++
	default:
		r.passed++
	}
}

// cleanupScenario runs a scenario's cleanup on a context of its own: the
// run's may be cancelled (an interrupt) and cleanup must still run. Its
// calls stop, as every call does, only when they stall.
func (r *run) cleanupScenario(s *S) {
	ctx := context.WithoutCancel(r.ctx)
	start := time.Now()
	summary, err := s.cleanup(ctx)
	if err != nil {
		s.failed = true
		r.rep.step(MarkFail, "clean up", time.Since(start), "")
		r.rep.detail(r.rep.style(styleRed, err.Error()))
		return
	}
	r.rep.step(MarkPass, "clean up", time.Since(start), summary)
}

// backend is the backend create picks in this run: --backend, else the
// one the doctor says create picks here.
func (r *run) backend() string {
	if b := r.cfg.Backend; b != "" && b != "auto" {
		return b
	}
	if r.host.doctor != nil {
		return r.host.doctor.Backend
	}
	return ""
}

// skipReason says why a scenario cannot run with this agent-vm on this
// host, and what would let it; "" when it can.
func (r *run) skipReason(sc Scenario) string {
	if miss := r.host.missingVerbs(sc.Verbs); len(miss) > 0 {
		noun := "command"
		if len(miss) > 1 {
			noun = "commands"
		}
		return fmt.Sprintf("this agent-vm has no `%s` %s yet (hint: test a newer agent-vm build)", strings.Join(miss, "`, `"), noun)
	}
	if sc.NeedsVM {
		if reason := r.host.vmSkip(); reason != "" {
			return reason
		}
		if reason := r.host.backendSkip(r.cfg.Backend); reason != "" {
			return reason
		}
	}
	if len(sc.Backends) > 0 {
		if backend := r.backend(); !slices.Contains(sc.Backends, backend) {
			return fmt.Sprintf("it tests the %s backend; this run creates VMs with %q (hint: --backend %s)", strings.Join(sc.Backends, " or "), backend, sc.Backends[0])
		}
	}
	return ""
}

// finish is the run's last cleanup: in its own state directory, any VM
// still there (one a scenario made without knowing, e.g. from a hostile
// branch name that create accepted) is stopped and destroyed; then the
// run's temporary directory goes, unless --keep kept something in it.
func (r *run) finish() {
	ctx := context.WithoutCancel(r.ctx)
	if r.kept {
		r.rep.printf("\nkept: %s (remove it when done: rm -rf %s, after destroying its VMs)\n", r.root, shellQuote(r.root))
		return
	}
	if r.ownState && r.av != nil {
		if err := r.sweep(ctx); err != nil {
			r.rep.print(r.rep.style(styleRed, "left behind: ") + err.Error() + "\n")
			r.failed++
		}
	}
	if err := os.RemoveAll(r.root); err != nil {
		r.rep.print(r.rep.style(styleRed, "error: ") + fmt.Sprintf("removing %s: %v\n", r.root, err))
		r.failed++
	}
}

// sweep stops and destroys every VM left in the run's own state directory.
// Anything there is an error: each scenario cleans up after itself.
func (r *run) sweep(ctx context.Context) error {
	if _, err := os.Stat(r.av.stateDir); os.IsNotExist(err) {
		return nil
	}
	s := &S{name: "sweep", av: r.av, rep: r.rep, dir: filepath.Join(r.root, ".sweep"),
		interrupted: func() bool { return false }}
	res := r.av.run(ctx, Call{Args: []string{"list", "--json"}})
	list, _, err := ParseList([]byte(res.Stdout))
	if res.ExitCode != 0 || err != nil {
		return fmt.Errorf("`%s`: %s %s", res.Short(), res.Outcome(), LastLine(res.Stderr))
	}
	var left []string
	for _, st := range list {
		if st.Branch == "" {
			left = append(left, fmt.Sprintf("an unreadable VM record %s (%s)", st.Slug, st.Error))
			continue
		}
		left = append(left, fmt.Sprintf("VM %q (%s)", st.Branch, st.State))
		s.Register(st.Branch, st.Git.Source)
	}
	if len(left) == 0 {
		return nil
	}
	_, err = s.cleanup(ctx)
	return errors.Join(fmt.Errorf("the state directory still held %s after every scenario cleaned up", strings.Join(left, ", ")), err)
}

// consoles are the serial consoles of the run's VMs and templates, whose
// growth the run's watch counts as progress: in the state directory, and
// in the template directories scenarios make in their own (agent-cli's).
func consoles(stateDir, root string) []string {
	var out []string
	for _, pat := range []string{
		filepath.Join(stateDir, "*", "logs", "*.log"),
		filepath.Join(templateDir(root), "*", "logs", "*.log"),
		filepath.Join(root, "*", "templates-*", "*", "logs", "*.log"),
	} {
		m, _ := filepath.Glob(pat)
		out = append(out, m...)
	}
	return out
}
