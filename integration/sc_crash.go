package integration

import (
	"context"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

func crashScenario() Scenario {
	return Scenario{
		Name:    "crash",
		Summary: "QEMU killed under a running VM: status says crashed, restart recovers",
		NeedsVM: true,
		Verbs:   []string{"create", "status", "start", "restart", "exec", "stop", "destroy"},
		run:     runCrash,
	}
}

const crashBranch = "itest/crash"

func runCrash(ctx context.Context, s *S) {
	var st *blackbox.Status
	s.Step(ctx, "make a git repo and create a VM", func() error {
		_, err := s.prepare(ctx, crashBranch, nil)
		return err
	})
	s.Step(ctx, "start it", func() (err error) {
		if _, err = s.start(ctx, crashBranch, 1); err != nil {
			return err
		}
		st, err = s.healthy(ctx, crashBranch)
		return err
	})
	s.Step(ctx, "SIGKILL its QEMU", func() error {
		if !isQEMU(st.Pid) {
			return failf(nil, "status --json says pid %d, which is not a QEMU process (%q)", st.Pid, cmdline(st.Pid))
		}
		if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
			return failf(nil, "kill -9 %d: %v", st.Pid, err)
		}
		if !waitGone(ctx, st.Pid, 10*time.Second) {
			return failf(nil, "QEMU (pid %d) survived SIGKILL for 10s", st.Pid)
		}
		return nil
	})
	s.Step(ctx, "status says crashed", func() error {
		now, err := s.waitState(ctx, crashBranch, "crashed", 10*time.Second)
		if err != nil {
			return err
		}
		if now.Detail != "" {
			s.notef("%s", truncate(now.Detail, 60))
		}
		return nil
	})
	s.Step(ctx, "restart recovers it, with a healthy agent", func() error {
		if _, err := s.boot(ctx, "restart", crashBranch, 1); err != nil {
			return err
		}
		now, err := s.healthy(ctx, crashBranch)
		if err != nil {
			return err
		}
		if now.Pid == st.Pid {
			return failf(nil, "the restarted VM reports the killed QEMU's pid %d", st.Pid)
		}
		_, err = s.execOK(ctx, crashBranch, "test", "-e", "README.md")
		return err
	})
}
