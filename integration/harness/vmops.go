package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// Create runs `agent-vm create B` in repoDir (plus --backend when
// the run has one) and registers the VM for cleanup when it succeeds.
func (s *S) Create(ctx context.Context, repoDir, branch string) (*Result, error) {
	res := s.TryCreate(ctx, repoDir, branch)
	return res, Want(res, 0)
}

// TryCreate runs `agent-vm create` with branchArgs (flags, then the
// branch last: B, or the deprecated --branch B or --branch=B) and the run's --backend in repoDir; the caller judges the
// outcome. A VM it makes is registered for cleanup.
func (s *S) TryCreate(ctx context.Context, repoDir string, branchArgs ...string) *Result {
	args := append([]string{"create"}, branchArgs...)
	if s.backend != "" {
		args = append(args, "--backend", s.backend)
	}
	if s.host != "" {
		args = append(args, "--host", s.host)
	}
	res := s.Call(ctx, Call{Args: args, Dir: repoDir})
	if res.ExitCode == 0 {
		branch := branchArgs[len(branchArgs)-1]
		if b, ok := strings.CutPrefix(branch, "--branch="); ok {
			branch = b
		}
		s.Register(branch, repoDir)
	}
	return res
}

// Status runs `status B --json` and parses it, checking the documented
// fields (keys) are there.
func (s *S) Status(ctx context.Context, branch string, keys []string) (*blackbox.Status, *Result, error) {
	res := s.AgentVM(ctx, "status", "--json", branch)
	if err := Want(res, 0); err != nil {
		return nil, res, err
	}
	st, err := ParseStatus([]byte(res.Stdout), keys)
	if err != nil {
		return nil, res, Failf(res, "`%s`: %v", res.Short(), err)
	}
	if st.Branch != branch {
		return nil, res, Failf(res, "`%s` describes branch %q, want %q", res.Short(), st.Branch, branch)
	}
	return st, res, nil
}

// Start runs `agent-vm start B` with a progress line fed by agent-vm's own
// progress output.
func (s *S) Start(ctx context.Context, branch string) (*Result, error) {
	return s.Boot(ctx, "start", branch)
}

// Boot runs a verb that boots a VM (start, restart) and waits for it, with
// agent-vm's own wait (its default --timeout, which grows with the host's
// load); env is added to agent-vm's environment (and so to the VM's egress
// proxy's).
func (s *S) Boot(ctx context.Context, verb, branch string, env ...string) (*Result, error) {
	res := s.CallShowing(ctx, "booting "+branch, Call{Args: []string{verb, branch}, Env: env})
	return res, Want(res, 0)
}

// CallShowing runs agent-vm with a progress line labelled label, fed by
// the lines it writes to stderr as they come (a boot's or a template
// build's progress).
func (s *S) CallShowing(ctx context.Context, label string, c Call) *Result {
	t := s.rep.begin(label)
	defer s.rep.end(t)
	c.onLine = func(l string) { s.rep.update(t, l) }
	return s.Call(ctx, c)
}

// StartAll starts the branches at the same time and waits for all.
func (s *S) StartAll(ctx context.Context, branches ...string) error {
	errs := make([]error, len(branches))
	var wg sync.WaitGroup
	for i, b := range branches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Start(ctx, b)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Prepare makes the scenario's git repo (with files) and a VM for branch.
func (s *S) Prepare(ctx context.Context, branch string, files map[string]string) (*Repo, error) {
	rp, err := NewRepo(ctx, s.dir, files)
	if err != nil {
		return nil, err
	}
	_, err = s.Create(ctx, rp.Dir, branch)
	return rp, err
}

// AllowPackageSources lets branch's egress proxy reach the addresses this
// host resolves the package sources to (apt's mirror for provisioning,
// npm's registry for an agent CLI, ...: as `agent-vm doctor --json` names
// them), as a user behind the same network would with `net allow`: the
// proxy refuses an address that is not globally reachable even for an
// allowed name unless that address itself is allowed or `agent-vm setup`
// pinned it, and the machines CI runs on answer every name with their
// gateway's address in 203.0.113.0/24. (The run's template scenario runs
// `setup`, which pins them for every VM of the user who runs the tests;
// the scenarios that allow them here do not depend on that.) Where the
// sources resolve to public addresses the allow changes nothing. A source
// that does not resolve here is left out.
func (s *S) AllowPackageSources(ctx context.Context, branch string) error {
	if len(s.sources) == 0 {
		return Failf(nil, "`agent-vm doctor --json` named no package sources (package_sources)")
	}
	var addrs, unresolved []string
	for _, h := range s.sources {
		as, err := net.DefaultResolver.LookupNetIP(ctx, "ip", h)
		if err != nil {
			unresolved = append(unresolved, h)
			continue
		}
		for _, a := range as {
			if a := a.Unmap().String(); !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	if len(addrs) == 0 {
		return Failf(nil, "none of the package sources resolves on the host: %s", strings.Join(unresolved, ", "))
	}
	res := s.Call(ctx, Call{Args: append([]string{"net", "allow", "--vm", branch}, addrs...)})
	return Want(res, 0)
}

// Stop runs `agent-vm stop B`.
func (s *S) Stop(ctx context.Context, branch string) (*Result, error) {
	res := s.Call(ctx, Call{Args: []string{"stop", branch}})
	return res, Want(res, 0)
}

// Exec runs `agent-vm exec B -- argv...` and returns the call; the caller
// judges the exit code.
func (s *S) Exec(ctx context.Context, branch string, argv ...string) *Result {
	args := append([]string{"exec", branch, "--"}, argv...)
	return s.Call(ctx, Call{Args: args})
}

// ExecOK runs a command in the guest and requires exit status 0.
func (s *S) ExecOK(ctx context.Context, branch string, argv ...string) (*Result, error) {
	res := s.Exec(ctx, branch, argv...)
	return res, Want(res, 0)
}

// Healthy requires the VM to be running with agent-mcp healthy.
func (s *S) Healthy(ctx context.Context, branch string) (*blackbox.Status, error) {
	st, res, err := s.Status(ctx, branch, RunningKeys())
	if err != nil {
		return nil, err
	}
	if st.State != "running" || st.Agent.State != "healthy" {
		return nil, Failf(res, "%s is %s with agent %s (%s), want running with agent healthy", branch, st.State, st.Agent.State, st.Agent.Detail)
	}
	if st.Pid <= 0 || !blackbox.Alive(st.Pid) {
		return nil, Failf(res, "%s is running but its pid %d is not a live process", branch, st.Pid)
	}
	return st, nil
}

// WaitState polls `status --json` until the VM's state is want.
func (s *S) WaitState(ctx context.Context, branch, want string) (*blackbox.Status, error) {
	var st *blackbox.Status
	err := s.Until(ctx, fmt.Sprintf("%s to be %s", branch, want), func() (bool, error) {
		var err error
		st, _, err = s.Status(ctx, branch, StatusKeys())
		if err != nil {
			return false, err
		}
		return st.State == want, fmt.Errorf("%s is %s", branch, st.State)
	})
	return st, err
}

// Until polls done, with backoff, until it says true. It gives up when
// done's error is GiveUp's (returning it), when the run is interrupted, or
// when nothing has moved for the run's --stall limit (then the error says
// what it waited for and done's last answer): a slow machine is no reason
// to fail. done's other errors say why it is not done yet.
func (s *S) Until(ctx context.Context, what string, done func() (bool, error)) error {
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if s.av.watch != nil {
		wctx, cancel = s.av.watch.Context(ctx, func() string { return what })
	}
	defer cancel()
	var last error
	for delay := 50 * time.Millisecond; ; delay = min(delay*2, 2*time.Second) {
		ok, err := done()
		if ok {
			return nil
		}
		if g, final := err.(giveUp); final {
			return g.error
		}
		last = err
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if last != nil {
				return Failf(nil, "%v (%v)", context.Cause(wctx), last)
			}
			return Failf(nil, "%v", context.Cause(wctx))
		case <-time.After(delay):
		}
	}
}

// giveUp is an answer of Until's done that ends the wait with its error.
type giveUp struct{ error }

// GiveUp is the answer of Until's done that ends the wait with err.
func GiveUp(err error) error { return giveUp{err} }

// serialTails prints the tail of each VM's serial console (what the guest
// said) and of its holder's logs, for a failed VM scenario.
func (s *S) serialTails(ctx context.Context) {
	for _, v := range s.made() {
		b := v.Branch
		res := s.av.run(ctx, v.Call("status", "--json"))
		st, err := ParseStatus([]byte(res.Stdout), nil)
		if res.ExitCode != 0 || err != nil || st.Paths.ConsoleLog == "" {
			continue
		}
		data, err := os.ReadFile(st.Paths.ConsoleLog)
		switch {
		case os.IsNotExist(err):
			s.rep.detail(fmt.Sprintf("serial console of %s: none (the VM never booted)", b))
			continue
		case err != nil:
			s.rep.detail(fmt.Sprintf("serial console of %s: %v", b, err))
			continue
		}
		var sb strings.Builder
		writeTail(&sb, fmt.Sprintf("serial console of %s (%s)", b, st.Paths.ConsoleLog), string(data))
		// agent-vm's logs of the VM's holder: its connection to the guest
		// and what its idle watch saw (hold.log), and the suspend and
		// resume that watch ran (idle.log).
		for _, name := range []string{"hold.log", "idle.log"} {
			if st.Paths.Dir == "" {
				break
			}
			p := filepath.Join(st.Paths.Dir, "logs", name)
			if data, err := os.ReadFile(p); err == nil {
				writeTail(&sb, fmt.Sprintf("%s of %s (%s)", name, b, p), string(data))
			}
		}
		// The guest's sshd and kernel, from its journal, when the VM still
		// runs: why a connection or session ended (a peer's reset, a
		// corrupted MAC, a process that crashed or was killed). sshd's own
		// lines, not its unit's: without logind sessions, what the
		// sessions ran (sudo) logs under ssh.service too.
		if st.State == "running" {
			jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			matches := []string{"_COMM=sshd", "+", "_TRANSPORT=kernel", "+", "UNIT=ssh.service"}
			res := s.av.run(jctx, Call{Args: append([]string{"exec", b, "--", "sudo", "-n", "journalctl", "-n", "30", "--no-pager", "-o", "short-monotonic"}, matches...), Dir: v.Dir})
			cancel()
			if res.ExitCode == 0 {
				writeTail(&sb, fmt.Sprintf("the guest's sshd and kernel log of %s (journalctl %s)", b, strings.Join(matches, " ")), res.Stdout)
			} else {
				sb.WriteString(fmt.Sprintf("the guest's sshd and kernel log of %s: `%s`: %s %s\n", b, res.Short(), res.Outcome(), LastLine(res.Stderr)))
			}
		}
		s.rep.detail(sb.String())
	}
}
