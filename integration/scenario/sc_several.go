package scenario

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
)

func severalScenario() harness.Scenario {
	return harness.Scenario{
		Name:    "several",
		Summary: "two branches booted together: distinct ports, both healthy, each its own workspace, neither reaches the other",
		NeedsVM: true,
		// Its VMs' first boot is not what it checks.
		Template: "none",
		Verbs:    []string{"create", "status", "start", "exec", "stop", "destroy"},
		Run:      runSeveral,
	}
}

func runSeveral(ctx context.Context, s *harness.S) {
	branches := []string{"itest/several-a", "itest/several-b"}
	sts := make([]*blackbox.Status, len(branches))
	s.Step(ctx, "make a git repo and create two VMs", func() error {
		rp, err := s.Prepare(ctx, branches[0], nil)
		if err != nil {
			return err
		}
		_, err = s.Create(ctx, rp.Dir, branches[1])
		return err
	})
	s.Step(ctx, "start both at once", func() error { return s.StartAll(ctx, branches...) })
	s.Step(ctx, "both are running with healthy agents on distinct ports", func() error {
		seen := map[int]string{}
		for i, b := range branches {
			st, err := s.Healthy(ctx, b)
			if err != nil {
				return err
			}
			sts[i] = st
			for _, p := range []int{st.Ports.SSH, st.Ports.MCP} {
				if other, dup := seen[p]; dup {
					return harness.Failf(nil, "port %d is used by %s and %s", p, other, b)
				}
				seen[p] = b
			}
			if sts[0].Pid == st.Pid && i > 0 {
				return harness.Failf(nil, "both VMs report QEMU pid %d", st.Pid)
			}
		}
		return nil
	})
	s.Step(ctx, "each VM sees its own workspace", func() error {
		for _, st := range sts {
			if err := os.WriteFile(filepath.Join(st.Paths.Workspace, "whoami.txt"), []byte(st.Branch+"\n"), 0o644); err != nil {
				return err
			}
		}
		for _, st := range sts {
			res, err := s.ExecOK(ctx, st.Branch, "cat", "whoami.txt")
			if err != nil {
				return err
			}
			if got := strings.TrimSpace(res.Stdout); got != st.Branch {
				return harness.Failf(res, "the VM of %s reads %q from its workspace: %s", st.Branch, got, fmt.Sprintf("want %q", st.Branch))
			}
		}
		return nil
	})
	s.Step(ctx, "neither VM reaches the other's SSH or agent-mcp port", func() error {
		for i, st := range sts {
			other := sts[1-i]
			for _, p := range []int{other.Ports.SSH, other.Ports.MCP} {
				if err := s.Unreachable(ctx, st.Branch, p); err != nil {
					return err
				}
			}
		}
		return nil
	})
	s.Step(ctx, "stop both", func() error {
		for _, st := range sts {
			if err := checkStop(ctx, s, st); err != nil {
				return err
			}
		}
		return nil
	})
}
