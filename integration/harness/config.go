package harness

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/agent-vm/agent-vm/blackbox"
)

// Exit codes of the integration-test binary.
const (
	ExitPassed      = 0
	ExitFailed      = 1
	ExitUsage       = 2
	ExitInterrupted = 130
)

// DefaultStall is how long a step may show no progress before it is
// stopped, unless --stall says otherwise (blackbox.Watch says what counts
// as progress). No step has a time to finish in: a slow machine, or one
// busy with two VMs, takes as long as it takes.
const DefaultStall = 10 * time.Minute

// Config is what one run is asked to do.
type Config struct {
	// AgentVM is the agent-vm binary under test; "" means the one beside
	// the integration-test binary, else the one on PATH.
	AgentVM string
	// StateDir is agent-vm's state directory; "" means a fresh temporary
	// directory, removed at the end. A given one is never removed: only
	// the VMs the run created in it are destroyed.
	StateDir string
	// Backend is passed to `agent-vm create --backend`; "" leaves agent-vm's
	// default (auto).
	Backend string
	// Host is passed to `agent-vm create --host`: a registered host the
	// run's VMs are placed on (`agent-vm host add` and `host link` made
	// it); "" places them on this machine.
	Host string
	// Run selects scenarios by name; nil runs all.
	Run *regexp.Regexp
	// Keep leaves the VMs and files of failed scenarios in place.
	Keep bool
	// Stall is how long a step may show no progress before it is stopped.
	Stall time.Duration
	// Verbose shows every agent-vm command and its output.
	Verbose bool
	// List prints the scenarios and exits.
	List bool

	// Where the run writes, and what it reads from its environment.
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	// Executable is the integration-test binary's own path (os.Executable);
	// agent-vm is looked for beside it.
	Executable func() (string, error)
	// IsTerminal reports whether Stdout is a terminal (colour, a redrawn
	// progress line).
	IsTerminal bool
	// TermWidth is the terminal's width in columns (0: unknown).
	TermWidth int
}

// ParseFlags parses the integration-test command line (without the program
// name) into a Config writing to stdout and stderr. On -h it prints the
// usage and returns flag.ErrHelp; on a mistake it prints the error with a
// hint and returns it. ExitCode turns either into an exit code.
func ParseFlags(args []string, stdout, stderr io.Writer) (Config, error) {
	cfg := Config{Stdout: stdout, Stderr: stderr, Getenv: os.Getenv, Executable: os.Executable}
	if f, ok := stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		cfg.IsTerminal = true
		cfg.TermWidth, _, _ = term.GetSize(int(f.Fd()))
	}
	fs := flag.NewFlagSet("integration-test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.AgentVM, "agent-vm", "", "the agent-vm binary to test (default: the one beside integration-test, else on PATH)")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "agent-vm's state directory (default: a fresh temporary one, removed at the end)")
	fs.StringVar(&cfg.Backend, "backend", "", "create VMs with this backend: auto, qemu, nixos, vagrant or libvirt (default: agent-vm's own choice); with vagrant, the steps it cannot do (port add, the browser bridges) are skipped, saying why")
	fs.StringVar(&cfg.Host, "host", "", "create VMs on this host, registered and linked with `agent-vm host add NAME URI` and `agent-vm host link NAME` (its VMs run through the libvirt backend)")
	run := fs.String("run", "", "run only the scenarios whose name matches this regular expression")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the VMs and files of failed scenarios for debugging, and print where they are")
	fs.DurationVar(&cfg.Stall, "stall", DefaultStall, "stop a step that shows no progress for this long (no new output, no guest console output, QEMU idle); a step that progresses runs as long as it needs")
	fs.BoolVar(&cfg.Verbose, "verbose", false, "show every agent-vm command and its output")
	fs.BoolVar(&cfg.List, "list", false, "list the scenarios and exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: integration-test [flags]\n\n"+
			"Drives the agent-vm binary through its command line, end to end, and says whether\n"+
			"this build works on this host. Scenarios that need what the host lacks are skipped\n"+
			"with the reason (set "+blackbox.StrictEnv+"=1 to count them as failures).\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "(run `integration-test -h` for the flags)")
		}
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, usageErr(stderr, "unexpected argument %q (integration-test takes only flags; to pick scenarios use --run REGEX)", fs.Arg(0))
	}
	if *run != "" {
		re, err := regexp.Compile(*run)
		if err != nil {
			return cfg, usageErr(stderr, "--run %q is not a regular expression: %v", *run, err)
		}
		cfg.Run = re
	}
	if cfg.Stall <= 0 {
		return cfg, usageErr(stderr, "--stall %s: must be positive, e.g. 10m", cfg.Stall)
	}
	switch cfg.Backend {
	case "", "auto", "qemu", "nixos", "vagrant", "libvirt":
	default:
		return cfg, usageErr(stderr, "--backend %q: must be auto, qemu, nixos, vagrant or libvirt", cfg.Backend)
	}
	if cfg.Host != "" && cfg.Backend != "" && cfg.Backend != "libvirt" && cfg.Backend != "auto" {
		return cfg, usageErr(stderr, "--host %s places VMs through the libvirt backend, not --backend %s (hint: drop --backend)", cfg.Host, cfg.Backend)
	}
	if cfg.Host != "" && cfg.Backend == "" {
		cfg.Backend = "libvirt"
	}
	return cfg, nil
}

// errUsage marks a command-line mistake that has already been printed.
var errUsage = errors.New("usage error")

func usageErr(stderr io.Writer, format string, args ...any) error {
	fmt.Fprintf(stderr, "integration-test: "+format+"\n", args...)
	return errUsage
}

// ExitCode is the exit code for an error from ParseFlags: 0 for -h, 2 for
// a mistake.
func ExitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return ExitPassed
	}
	return ExitUsage
}

func withDefaults(cfg Config) Config {
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	if cfg.Executable == nil {
		cfg.Executable = os.Executable
	}
	if cfg.Stall <= 0 {
		cfg.Stall = DefaultStall
	}
	return cfg
}

// findAgentVM resolves --agent-vm, else the agent-vm beside this binary,
// else the one on PATH, to an absolute path.
func findAgentVM(cfg Config) (string, error) {
	if cfg.AgentVM != "" {
		p, err := filepath.Abs(cfg.AgentVM)
		if err != nil {
			return "", err
		}
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("--agent-vm %s: not an executable file (hint: build one with `go build -tags agentvm_testhooks -o agent-vm ./cmd/agent-vm`)", cfg.AgentVM)
		}
		return p, nil
	}
	if exe, err := cfg.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "agent-vm")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath("agent-vm")
	if err != nil {
		return "", fmt.Errorf("no agent-vm beside integration-test nor on PATH (hint: pass --agent-vm PATH, e.g. after `go build -tags agentvm_testhooks -o agent-vm ./cmd/agent-vm`)")
	}
	return filepath.Abs(p)
}

// childEnv is agent-vm's environment: ours, without AGENT_VM_STATE_DIR
// (every call passes --state-dir).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AGENT_VM_STATE_DIR=") {
			env = append(env, kv)
		}
	}
	return env
}

// colorOn: colour on a terminal, unless NO_COLOR is set (no-color.org:
// to any non-empty value).
func colorOn(cfg Config) bool { return cfg.IsTerminal && cfg.Getenv("NO_COLOR") == "" }

func selectScenarios(all []Scenario, re *regexp.Regexp) []Scenario {
	var out []Scenario
	for _, sc := range all {
		if re == nil || re.MatchString(sc.Name) {
			out = append(out, sc)
		}
	}
	return out
}

func names(scs []Scenario) []string {
	out := make([]string, len(scs))
	for i, sc := range scs {
		out[i] = sc.Name
	}
	return out
}

// verbsOf lists the agent-vm commands the scenarios need.
func verbsOf(scs []Scenario) []string {
	seen := map[string]bool{}
	var out []string
	for _, sc := range scs {
		for _, v := range sc.Verbs {
			if !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
		}
	}
	return out
}

func listScenarios(rep *reporter, scs []Scenario) {
	for _, sc := range scs {
		needs := "records only, no VM"
		if sc.NeedsVM {
			needs = "boots VMs"
		}
		rep.printf("%-10s %s (%s; agent-vm commands: %s)\n", sc.Name, sc.Summary, needs, strings.Join(sc.Verbs, ", "))
	}
}
