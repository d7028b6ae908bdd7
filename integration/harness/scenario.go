package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Scenario is one end-to-end story told through the agent-vm CLI.
type Scenario struct {
	Name    string
	Summary string
	// NeedsVM: the scenario boots VMs, so it is skipped where they cannot
	// boot (no qemu, no base image).
	NeedsVM bool
	// Verbs are the agent-vm commands it needs; it is skipped, with the
	// reason, when this agent-vm build lacks one.
	Verbs []string
	// Backends, when set, are the only backends the scenario tests (a
	// feature the others do not have yet); other runs skip it.
	Backends []string
	// Template, when set, says that the scenario's VMs may start from the
	// run's template (template.go) and which agent CLI it must hold
	// ("none", "claude"): their first boot is not what the scenario checks.
	Template string
	Run      func(ctx context.Context, s *S)
}

// S is a scenario while it runs: its agent-vm, its own temporary directory,
// the VMs it made, and how its steps went.
type S struct {
	name    string
	av      *agentVM
	rep     *reporter
	dir     string // the scenario's own files (git repos)
	backend string // --backend for create; "" for agent-vm's default
	host    string // --host for create; "" for this machine
	vm      bool   // the scenario boots VMs: show their serial consoles on failure
	// sources are the package sources `agent-vm doctor --json` names.
	sources []string
	// testHooks: agent-vm's egress proxy reads its test hooks (`agent-vm
	// version` ends in +testhooks: a build with -tags agentvm_testhooks).
	testHooks bool
	// interrupted reports whether the user interrupted the run.
	interrupted func() bool

	mu      sync.Mutex
	vms     []VMRef // VMs created, for cleanup and serial logs
	last    *Result // the latest agent-vm call of the running step
	note    string  // what the running step wants said on its line
	failed  bool
	stopped bool // a step failed: the rest are not run
}

// stepError is a failed check, with the agent-vm call it is about.
type stepError struct {
	msg string
	res *Result
}

func (e *stepError) Error() string { return e.msg }

// Failf fails a step about res (nil: about the step's latest call).
func Failf(res *Result, format string, args ...any) error {
	return &stepError{msg: fmt.Sprintf(format, args...), res: res}
}

// Step runs one step unless an earlier one failed, and prints its line.
// A failure prints what went wrong, the agent-vm call it is about (exit
// code, stdout, stderr) and, in a VM scenario, the serial console's tail.
func (s *S) Step(ctx context.Context, name string, f func() error) {
	if s.stopped {
		if !s.interrupted() {
			s.rep.step(MarkSkip, name, 0, "")
		}
		return
	}
	s.mu.Lock()
	s.last, s.note = nil, ""
	s.mu.Unlock()
	if s.rep.verbose {
		s.rep.print("  " + s.rep.style(styleDim, "· "+name) + "\n")
	}
	start := time.Now()
	err := f()
	elapsed := time.Since(start)
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err == nil {
		s.rep.step(MarkPass, name, elapsed, s.note)
		return
	}
	s.stopped = true
	switch {
	case s.interrupted():
		s.rep.step(MarkFail, name, elapsed, "interrupted")
		return
	}
	s.failed = true
	s.rep.step(MarkFail, name, elapsed, "")
	s.rep.detail(s.rep.style(styleRed, err.Error()))
	var se *stepError
	res := s.LastResult()
	if errors.As(err, &se) && se.res != nil {
		res = se.res
	}
	if res != nil {
		s.rep.command(res, true)
	}
	if s.vm {
		s.serialTails(ctx)
	}
}

// StepUnless is Step, unless skip (why the step cannot run in this run)
// is set: then the step's line says it was skipped and why.
func (s *S) StepUnless(ctx context.Context, name, skip string, f func() error) {
	if skip != "" && !s.stopped {
		s.rep.step(MarkSkip, name, 0, "skipped: "+skip)
		return
	}
	s.Step(ctx, name, f)
}

// Features a backend may lack, which lacks names.
const (
	FeaturePorts   = "ports"   // port add and rm
	FeatureBrowser = "browser" // the browser bridges
)

// Lacks says why this run's backend cannot do feature, "" when it can:
// the vagrant backend forwards the SSH and MCP ports only; the vagrant
// and libvirt runs leave the browser bridges to the qemu runs.
func (s *S) Lacks(feature string) string {
	switch {
	case feature == FeaturePorts && s.backend == "vagrant":
		return "the vagrant backend forwards only the SSH and MCP ports (`port add` refuses its VMs)"
	case feature == FeatureBrowser && s.OnLibvirt():
		return "the browser bridges ride the held SSH connection, the same for every backend, and are tested with the qemu backend's VMs (the " + s.backend + " run keeps to what differs)"
	}
	return ""
}

// OnLibvirt: this run's VMs are libvirt's domains, each on a libvirt
// network of its own (the vagrant and libvirt backends).
func (s *S) OnLibvirt() bool { return s.backend == "vagrant" || s.backend == "libvirt" }

// Notef sets the note printed on the running step's line when it passes.
func (s *S) Notef(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.note = fmt.Sprintf(format, args...)
}

func (s *S) LastResult() *Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// AgentVM runs agent-vm in the run's neutral directory.
func (s *S) AgentVM(ctx context.Context, args ...string) *Result {
	return s.Call(ctx, Call{Args: args})
}

// Call runs agent-vm and remembers the call as the step's latest.
func (s *S) Call(ctx context.Context, c Call) *Result {
	res := s.av.run(ctx, c)
	s.mu.Lock()
	s.last = res
	s.mu.Unlock()
	return res
}

// Want checks a call's exit code.
func Want(res *Result, code int) error {
	if res.ExitCode == code && res.Err == nil {
		return nil
	}
	return Failf(res, "`%s`: %s, want exit status %d", res.Short(), res.Outcome(), code)
}

// OK runs agent-vm and requires exit status 0.
func (s *S) OK(ctx context.Context, args ...string) (*Result, error) {
	res := s.AgentVM(ctx, args...)
	return res, Want(res, 0)
}

// VMRef names a VM as a user would: its branch, from the repository it
// belongs to (agent-vm resolves branch names within the repository it runs
// in; "" runs it outside any repository).
type VMRef struct {
	Branch string
	Dir    string
}

// Call is a call about this VM, from its repository.
func (v VMRef) Call(args ...string) Call { return Call{Args: append(args, v.Branch), Dir: v.Dir} }

// Register records a VM the scenario made, for cleanup.
func (s *S) Register(branch, dir string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.vms {
		if v.Branch == branch && v.Dir == dir {
			return
		}
	}
	s.vms = append(s.vms, VMRef{Branch: branch, Dir: dir})
}

func (s *S) made() []VMRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]VMRef(nil), s.vms...)
}

// Dir is the scenario's own directory, for its files (git repositories).
func (s *S) Dir() string { return s.dir }

// userConfigEnv names the settings file agent-vm reads in place of the
// user's ~/.config/agent-vm/config.toml (userconfig.PathEnv: the harness
// drives agent-vm as a user would, through its command line and
// environment, and imports none of its packages).
const userConfigEnv = "AGENT_VM_CONFIG"

// UserConfig writes the scenario's settings file (what a user keeps in
// ~/.config/agent-vm/config.toml), which every agent-vm the scenario runs
// reads, and its VMs' holders at each look: "" removes it.
func (s *S) UserConfig(toml string) error {
	path := filepath.Join(s.dir, "config.toml")
	if toml == "" {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	return os.WriteFile(path, []byte(toml), 0o600)
}

// StateDir is agent-vm's state directory in this run.
func (s *S) StateDir() string { return s.av.stateDir }

// WorkDir is where agent-vm runs unless a call says otherwise: the run's
// temporary directory, which is no git checkout.
func (s *S) WorkDir() string { return s.av.dir }

// Backend is what create is given as --backend in this run; "" for
// agent-vm's default.
func (s *S) Backend() string { return s.backend }

// Host is what create is given as --host in this run; "" for this machine.
func (s *S) Host() string { return s.host }

// TestHooks reports whether agent-vm's egress proxy reads its test hooks
// (`agent-vm version` ends in +testhooks).
func (s *S) TestHooks() bool { return s.testHooks }

// TempDir makes a fresh directory inside the scenario's own.
func (s *S) TempDir(pattern string) (string, error) {
	return os.MkdirTemp(s.dir, pattern)
}
