package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// agentVM runs the agent-vm binary under test. It is the only way the
// integration test touches agent-vm: through its command line.
type agentVM struct {
	bin      string // absolute path
	stateDir string
	env      []string
	// dir is where commands run unless a call says otherwise: a directory
	// that is not a git checkout, so no command picks up a branch from it.
	dir string
	// watch tells a slow call from a hung one: a call is stopped only
	// when nothing has moved for its limit (nil: never).
	watch *blackbox.Watch
	// grace is how long a call may take to finish after it was sent SIGINT
	// (agent-vm stops a booting VM then) before it is killed.
	grace time.Duration
	rep   *reporter
}

// Call is one agent-vm invocation.
type Call struct {
	Args []string
	Dir  string // "" = agentVM.dir (S.WorkDir)
	// onLine receives each line agent-vm writes to stderr, as it comes
	// (start's progress lines).
	onLine func(string)
	// Quiet calls are not shown in verbose mode (probes of the build).
	Quiet bool
	// Stdin is what agent-vm reads (nil: nothing); Env is added to its
	// environment for this call only.
	Stdin io.Reader
	Env   []string
}

// Result is one finished agent-vm call.
type Result struct {
	Bin      string
	StateDir string
	Args     []string // after the global flags
	Dir      string
	ExitCode int // -1 when the process did not exit by itself
	Stdout   string
	Stderr   string
	Elapsed  time.Duration
	// Err is set when agent-vm could not be run, or had to be killed.
	Err error
	// Stalled is set when the call was stopped because nothing moved for
	// the run's --stall limit.
	Stalled     *blackbox.StallError
	Interrupted bool
}

// run runs agent-vm with the state directory and args, for as long as it
// takes. When ctx ends, or nothing has moved for the watch's limit,
// agent-vm gets SIGINT, as from Ctrl-C, so its own interrupt handling (a
// booting VM is stopped again) runs; only if it has not exited after the
// grace period is it killed. agent-vm runs in its own process group, so a
// Ctrl-C on the terminal reaches it once, through us, rather than twice.
func (a *agentVM) run(ctx context.Context, c Call) *Result {
	res := &Result{Bin: a.bin, StateDir: a.stateDir, Args: c.Args, Dir: c.Dir, ExitCode: -1}
	if res.Dir == "" {
		res.Dir = a.dir
	}
	var mu sync.Mutex
	lastLine := ""
	onLine := func(l string) {
		if strings.TrimSpace(l) != "" {
			mu.Lock()
			lastLine = strings.TrimSpace(l)
			mu.Unlock()
		}
		if c.onLine != nil {
			c.onLine(l)
		}
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if a.watch != nil {
		cctx, cancel = a.watch.Context(ctx, func() string {
			mu.Lock()
			defer mu.Unlock()
			if lastLine == "" {
				return "`" + res.Short() + "`, which had printed nothing"
			}
			return "`" + res.Short() + "`, whose last line was: " + lastLine
		})
	}
	defer cancel()
	if !c.Quiet {
		a.rep.started(res)
	}
	ex := blackbox.Run(cctx, blackbox.Cmd{
		Path: a.bin, Args: append([]string{"--state-dir", a.stateDir}, c.Args...),
		Dir: res.Dir, Env: append(slices.Clone(a.env), c.Env...), Grace: a.grace, OnLine: onLine, Stdin: c.Stdin,
		Watch: a.watch,
	})
	res.Elapsed = ex.End.Sub(ex.Start)
	res.Stdout, res.Stderr, res.ExitCode = ex.Stdout, ex.Stderr, ex.Code
	var stall *blackbox.StallError
	switch {
	case ctx.Err() != nil:
		res.Interrupted = true
	case errors.As(context.Cause(cctx), &stall):
		res.Stalled = stall
	}
	var exitErr *exec.ExitError
	if ex.Err != nil && (!errors.As(ex.Err, &exitErr) || res.ExitCode < 0) {
		res.Err = ex.Err // it did not run, or a signal ended it ("signal: killed")
	}
	if a.rep.verbose && !c.Quiet {
		a.rep.command(res, false)
	}
	return res
}

// Short is the call as a person would type it, with agent-vm on PATH and
// the state directory implied.
func (r *Result) Short() string {
	return "agent-vm " + shellJoin(r.Args)
}

// Reproduce is a shell command line that runs the call again.
func (r *Result) Reproduce() string {
	argv := append([]string{r.Bin, "--state-dir", r.StateDir}, r.Args...)
	return "cd " + shellQuote(r.Dir) + " && " + shellJoin(argv)
}

// Outcome says how the call ended.
func (r *Result) Outcome() string {
	var parts []string
	switch {
	case r.Interrupted:
		parts = append(parts, "interrupted (sent SIGINT)")
	case r.Stalled != nil:
		parts = append(parts, fmt.Sprintf("stopped after %s: %v (sent SIGINT)", r.Elapsed.Truncate(time.Second), r.Stalled))
	}
	switch {
	case r.ExitCode >= 0:
		parts = append(parts, fmt.Sprintf("exit status %d", r.ExitCode))
	case r.Err != nil:
		parts = append(parts, r.Err.Error())
	default:
		parts = append(parts, "did not exit by itself")
	}
	return strings.Join(parts, ", ")
}
