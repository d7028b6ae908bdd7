// Command bench measures what agent-vm users feel (the figures P1
// to P9 and the MCP proxy's overhead) and writes the results as JSON and
// as a markdown table to bench/results/<date>-<short commit>.{json,md}.
//
// Run it from a checkout of agent-vm, on a Linux host with QEMU and the
// base image (`agent-vm image build`):
//
//	go run ./bench                 # everything, about 45 minutes under TCG on 2 cores
//	go run ./bench -only 'P4|P5'   # a few figures (regexp on the figure ids)
//	go run ./bench -no-boot        # only what needs no VM boot (P4, P5, MCP)
//
// The speed figures in one run, for docs/benchmarks.md's speed
// section: P1' (a new branch's create + start, cold and from a template
// it builds and removes at the end), P2 (suspend and resume),
// P3 (exec, with its floor), P6 (workspace I/O, P6b included) and P7
// (several VMs at once), with P1 (boots), whose new branches P1' reuses:
//
//	go run ./bench -only 'P1|P2|P3|P6|P7'
//
// or, for P1', P2 and P3 alone (P1' then boots new branches of its own):
//
//	go run ./bench -only "P1'|P2|P3"
//
// The figures the README sets goals for, side by side: P1' (its cold
// rounds, then a template and new branches from it), P6, P7 with 6 VMs at
// once, and P9 (a new branch's `run --agent claude -- --version`, with a
// template holding claude that it builds), about 35 minutes under TCG on
// 2 cores (25 with -rounds 1):
//
//	BENCH_P7_GROUPS=6 go run ./bench -only "P1'|P6|P7|P9"
//
// It builds agent-vm from the checkout (CGO_ENABLED=0) and drives it only
// through its command line, in a temp state directory it removes at the
// end, also on failure or Ctrl-C. Every figure is a ratio against a
// reference measured side by side in the same run: the machine may be
// shared, and absolute times drift. See the "How to read" paragraph at the
// top of every results .md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/bench/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// config is the harness's settings, from its flags.
type config struct {
	Out      string
	N        int
	Rounds   int
	Records  int
	Only     *regexp.Regexp
	NoBoot   bool
	AgentVM  string
	Tree     string
	MCPRuns  int
	Fleet    int
	Timeout  time.Duration
	Root     string // the agent-vm checkout
	Command  string // how the harness was run, for the results
	Settings report.Settings
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	var only string
	fs.StringVar(&c.Out, "out", "", "where to write the results (default: bench/results in the checkout)")
	fs.IntVar(&c.N, "n", 15, "samples per side for fast figures (P3, P4, P5)")
	fs.IntVar(&c.Rounds, "rounds", 2, "rounds for boots (P1) and workspace I/O (P6); each P1 round boots 4 times")
	fs.IntVar(&c.Records, "records", 100, "VM records for P5's list")
	fs.StringVar(&only, "only", "", "run only the figures whose id matches this regexp, with its number whole (P1 is not P10), e.g. 'P4|P5' or MCP")
	fs.BoolVar(&c.NoBoot, "no-boot", false, "skip everything that boots a VM")
	fs.StringVar(&c.AgentVM, "agent-vm", "", "an agent-vm binary to measure (default: built from the checkout with CGO_ENABLED=0)")
	fs.StringVar(&c.Tree, "tree", "", "the source tree for the workspaces and P6 (default: GOROOT/src/cmd)")
	fs.IntVar(&c.Fleet, "fleet", 20, "VMs P12 starts and hibernates (each a template start; 0: none)")
	fs.IntVar(&c.MCPRuns, "mcp-runs", 3, "runs of the MCP proxy benchmarks (each runs every benchmark once, 2000 iterations)")
	fs.DurationVar(&c.Timeout, "timeout", 90*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (hint: flags only, e.g. -only P1)", fs.Arg(0))
	}
	if c.N < 1 || c.Rounds < 1 || c.Records < 1 || c.MCPRuns < 1 {
		return c, errors.New("-n, -rounds, -records and -mcp-runs must be at least 1")
	}
	if only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			return c, fmt.Errorf("-only %q is not a regexp: %w", only, err)
		}
		c.Only = re
	}
	c.Command = shellJoin(append([]string{"go", "run", "./bench"}, args...))
	c.Settings = report.Settings{N: c.N, Rounds: c.Rounds, Records: c.Records, Only: only, NoBoot: c.NoBoot}
	return c, nil
}

// run is the whole harness; it returns the exit code: 0 every selected
// figure was measured (or skipped with a reason), 1 some failed, 2 bad
// flags or no checkout, 130 interrupted.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	began := time.Now()
	log := newLogger(stderr, began)
	if cfg.Root, err = moduleRoot(ctx); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	if cfg.Out == "" {
		cfg.Out = filepath.Join(cfg.Root, "bench", "results")
	}
	if cfg.Tree == "" {
		if cfg.Tree, err = defaultTree(ctx); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 2
		}
	}
	cfg.Settings.Tree = cfg.Tree
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	res, err := measure(ctx, cfg, log, began)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		if errors.Is(err, errInterrupted) {
			return 130
		}
		return 1
	}
	jsonPath, mdPath, err := res.Write(cfg.Out)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	fmt.Fprintf(stdout, "results: %s\n         %s\n", mdPath, jsonPath)
	for _, f := range res.Figures {
		if len(f.Errors) > 0 {
			fmt.Fprintf(stderr, "bench: %s had errors (see %s)\n", f.ID, mdPath)
			return 1
		}
	}
	return 0
}

// measure builds agent-vm, runs the selected figures in a lab and cleans
// the lab up, whatever happened.
func measure(ctx context.Context, cfg config, log *logger, began time.Time) (*report.Result, error) {
	res := &report.Result{Schema: report.SchemaVersion, Date: began.UTC(), Command: cfg.Command}
	var err error
	if res.Commit, res.CommitShort, res.Dirty, err = commitInfo(ctx, cfg.Root); err != nil {
		return nil, err
	}
	l, err := newLab(cfg, log, cfg.AgentVM)
	if err != nil {
		return nil, err
	}
	defer func() {
		log.Printf("cleaning up %s", l.dir)
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := l.cleanup(cctx); err != nil {
			log.Printf("cleanup: %v", err)
		}
	}()
	if l.av.bin == "" {
		log.Printf("building agent-vm from %s", cfg.Root)
		if l.av.bin, err = buildAgentVM(ctx, cfg.Root, l.dir); err != nil {
			return nil, err
		}
		for _, o := range l.others {
			o.bin = l.av.bin
		}
	}
	res.Machine = machineInfo(ctx, l.av)
	log.Printf("machine: %d cores, %s, accel %s, load %.2f, other VMs running: %d",
		res.Machine.Cores, res.Machine.CPUModel, orDefault(res.Machine.Accel, "unknown"), res.Machine.LoadStart, len(res.Machine.OtherVMs))
	l.canBoot = bootable(ctx, cfg, l)
	canBoot := l.canBoot
	for _, spec := range selected(cfg.Only) {
		f := &report.Figure{ID: spec.ID, Title: spec.Title}
		res.Figures = append(res.Figures, f)
		if spec.Boots && canBoot != "" {
			f.Skipped = canBoot
			log.Printf("%s: skipped: %s", f.ID, canBoot)
			continue
		}
		f.LoadStart, f.OtherVMs = loadAvg(), otherVMs(l.dir)
		log.Printf("%s: %s (load %.2f, other VMs: %d)", f.ID, f.Title, f.LoadStart, len(f.OtherVMs))
		t0 := time.Now()
		if err := spec.Run(ctx, l, f); err != nil {
			f.Errors = append(f.Errors, err.Error())
			log.Printf("%s: error: %v", f.ID, err)
		}
		f.Seconds, f.LoadEnd = time.Since(t0).Seconds(), loadAvg()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w during %s: %v", errInterrupted, f.ID, context.Cause(ctx))
		}
	}
	res.Settings = cfg.Settings
	res.Settings.TreeFiles = l.treeFiles
	res.Machine.LoadEnd = loadAvg()
	res.Seconds = time.Since(began).Seconds()
	return res, nil
}

// selected are the figures -only picks (every one without it), in the
// order they run.
func selected(only *regexp.Regexp) []figureSpec {
	var specs []figureSpec
	for _, spec := range figureSpecs() {
		if only == nil || matchesID(only, spec.ID) {
			specs = append(specs, spec)
		}
	}
	return specs
}

// matchesID says whether only matches the figure id with its number whole:
// P1 selects P1 and P1' but not P10.
func matchesID(only *regexp.Regexp, id string) bool {
	for _, m := range only.FindAllStringIndex(id, -1) {
		if end := m[1]; end == len(id) || id[end] < '0' || id[end] > '9' {
			return true
		}
	}
	return false
}

// bootable says why VMs cannot boot here ("" when they can).
func bootable(ctx context.Context, cfg config, l *lab) string {
	if cfg.NoBoot {
		return "-no-boot"
	}
	var doctor struct {
		VMReady bool `json:"vm_ready"`
		Checks  []struct {
			Name   string `json:"name"`
			OK     bool   `json:"ok"`
			Detail string `json:"detail"`
			Hint   string `json:"hint"`
		} `json:"checks"`
	}
	res := l.av.run(ctx, quickTimeout, "doctor", "--json")
	if err := json.Unmarshal([]byte(res.Stdout), &doctor); err != nil {
		return fmt.Sprintf("`agent-vm doctor --json` did not answer: %v", err)
	}
	if doctor.VMReady {
		return ""
	}
	var missing []string
	for _, c := range doctor.Checks {
		if !c.OK && c.Name != "kvm" && !strings.Contains(c.Name, "nix") {
			missing = append(missing, c.Name+": "+c.Detail+" "+c.Hint)
		}
	}
	return "this host cannot boot VMs (`agent-vm doctor`: " + strings.Join(missing, "; ") + ")"
}

// moduleRoot is the agent-vm checkout the harness runs in.
func moduleRoot(ctx context.Context) (string, error) {
	res := runCmd(ctx, cmdSpec{Path: "go", Args: []string{"list", "-m", "-f", "{{.Path}} {{.Dir}}"}, Timeout: quickTimeout})
	path, dir, _ := strings.Cut(strings.TrimSpace(res.Stdout), " ")
	if res.Err != nil || path != "github.com/agent-vm/agent-vm" {
		return "", fmt.Errorf("run the harness from a checkout of agent-vm (go list -m says %q) (hint: cd into the repository and run `go run ./bench`)", strings.TrimSpace(res.Stdout+res.Stderr))
	}
	return dir, nil
}

// commitInfo is the checkout's commit and whether it has changes.
func commitInfo(ctx context.Context, root string) (full, short string, dirty bool, err error) {
	git := func(args ...string) (string, error) {
		res := runCmd(ctx, cmdSpec{Path: "git", Args: append([]string{"-C", root}, args...), Timeout: quickTimeout})
		return strings.TrimSpace(res.Stdout), res.Err
	}
	if full, err = git("rev-parse", "HEAD"); err != nil {
		return "", "", false, err
	}
	if short, err = git("rev-parse", "--short", "HEAD"); err != nil {
		return "", "", false, err
	}
	// The results directory does not count: a run writes there.
	st, err := git("status", "--porcelain", "--", ".", ":(exclude)bench/results")
	return full, short, st != "", err
}

// buildAgentVM builds the checkout's agent-vm, statically linked (the same
// binary runs in the guests), into dir.
func buildAgentVM(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "agent-vm")
	res := runCmd(ctx, cmdSpec{Path: "go", Args: []string{"build", "-o", bin, "./cmd/agent-vm"}, Dir: root,
		Env: append(os.Environ(), "CGO_ENABLED=0"), Timeout: 10 * time.Minute})
	return bin, res.Err
}
