package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/blackbox"
)

// cleanup stops and destroys the VMs the scenario made (only those: a
// given state directory may hold the user's own) and removes its files.
// It reports every problem, because leaving something behind is a failure
// of agent-vm the user should hear about: a VM that would not stop, a QEMU
// or virtiofsd still running after destroy (it is killed, and reported).
func (s *S) cleanup(ctx context.Context) (summary string, err error) {
	var problems []error
	res := s.av.run(ctx, Call{Args: []string{"list", "--json"}})
	list, _, lerr := ParseList([]byte(res.Stdout))
	if res.ExitCode != 0 || lerr != nil {
		problems = append(problems, fmt.Errorf("`%s`: %s %s", res.Short(), res.Outcome(), LastLine(res.Stderr)))
	}
	find := func(v VMRef) (blackbox.Status, bool) {
		for _, st := range list {
			if st.Branch == v.Branch && (v.Dir == "" || SamePath(st.Git.Source, v.Dir)) {
				return st, true
			}
		}
		return blackbox.Status{}, false
	}
	stopped, destroyed := 0, 0
	mine := s.made()
	for i := len(mine) - 1; i >= 0; i-- {
		v := mine[i]
		st, ok := find(v)
		if !ok && lerr == nil {
			continue // destroyed by the scenario itself
		}
		if ok && st.State != "stopped" && st.State != "invalid" {
			res := s.av.run(ctx, v.Call("stop"))
			if res.ExitCode != 0 {
				problems = append(problems, fmt.Errorf("`%s`: %s %s", res.Short(), res.Outcome(), LastLine(res.Stderr)))
			} else {
				stopped++
			}
		}
		res := s.av.run(ctx, v.Call("destroy", "--force"))
		if res.ExitCode != 0 {
			problems = append(problems, fmt.Errorf("`%s`: %s %s", res.Short(), res.Outcome(), LastLine(res.Stderr)))
		} else {
			destroyed++
		}
		if ok {
			problems = append(problems, reap(st)...)
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		problems = append(problems, fmt.Errorf("removing %s: %w", s.dir, err))
	}
	var parts []string
	if stopped > 0 {
		parts = append(parts, fmt.Sprintf("stopped %d", stopped))
	}
	if destroyed > 0 {
		parts = append(parts, fmt.Sprintf("destroyed %d VM(s)", destroyed))
	}
	parts = append(parts, "removed its files")
	return strings.Join(parts, ", "), errors.Join(problems...)
}

// reap finds processes a destroyed VM left behind: its QEMU (by pid) and
// anything whose command line names the VM's directory (virtiofsd). It
// kills them, so the run leaves nothing, and says so.
func reap(st blackbox.Status) []error {
	var problems []error
	if st.Pid > 0 && blackbox.Alive(st.Pid) && IsQEMU(st.Pid) {
		_ = syscall.Kill(st.Pid, syscall.SIGKILL)
		problems = append(problems, fmt.Errorf("QEMU of %s (pid %d) was still running after stop and destroy; killed it", st.Branch, st.Pid))
	}
	if st.Paths.Dir == "" {
		return problems
	}
	for _, p := range ProcessesMentioning(st.Paths.Dir) {
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		problems = append(problems, fmt.Errorf("pid %d (%s) still used %s after destroy; killed it", p.Pid, Truncate(p.CommandLine(), 120), st.Paths.Dir))
	}
	return problems
}

// keep prints where a failed scenario's VMs and files are, and how to look
// at them and remove them.
func (s *S) keep(ctx context.Context) {
	var b strings.Builder
	fmt.Fprintf(&b, "kept for debugging (--keep):\n")
	fmt.Fprintf(&b, "  files:     %s\n", s.dir)
	sd := shellQuote(s.av.stateDir)
	for _, v := range s.made() {
		res := s.av.run(ctx, v.Call("status", "--json"))
		if res.ExitCode != 0 {
			continue
		}
		q, cd := shellQuote(v.Branch), ""
		if v.Dir != "" {
			cd = "cd " + shellQuote(v.Dir) + " && "
		}
		fmt.Fprintf(&b, "  VM %s: %sagent-vm --state-dir %s status %s   (logs, shell, exec work the same way)\n", v.Branch, cd, sd, q)
		fmt.Fprintf(&b, "    remove it: %sagent-vm --state-dir %s destroy --force %s\n", cd, sd, q)
	}
	s.rep.detail(b.String())
}
