package integration

import (
	"context"
	"strings"
	"time"
)

func agentCLIScenario() Scenario {
	return Scenario{
		Name:    "agent-cli",
		Summary: "create --agent claude: the real Claude Code CLI from npm is installed in the guest and runs (no API call)",
		NeedsVM: true,
		// The nixos backend cannot install agent CLIs yet (create refuses).
		Backends: []string{"qemu", "vagrant"},
		Verbs:    []string{"create", "status", "start", "exec", "destroy"},
		run:      runAgentCLI,
	}
}

const agentBranch = "itest/agent-cli"

// agentInstallTimeout is what the first boot's npm install of the agent CLI
// adds to a boot with KVM (S.scale multiplies it under TCG). Claude Code
// 2.1.330 is ~350 MB from the registry: npm 9.2 (Debian 12) ignores the
// platform packages' libc field, so it fetches and unpacks the glibc and
// the musl binary (175 MB each); under TCG that takes about 3.5 minutes
// after SSH is up, more on a busy host.
const agentInstallTimeout = 2 * time.Minute

// runAgentCLI: the guest installs the agent CLI from the npm registry on
// its first boot (through the host's TLS-inspecting proxy, whose CA the
// guest trusts), and `claude --version` runs in it. Nothing here calls the
// agent's API: no key is available on these machines.
func runAgentCLI(ctx context.Context, s *S) {
	var rp *repo
	s.Step(ctx, "make a git repo and create a VM with --agent claude", func() (err error) {
		if rp, err = newRepo(ctx, s.dir, nil); err != nil {
			return err
		}
		res := s.tryCreate(ctx, rp.Dir, "--agent", "claude", "--branch", agentBranch)
		if err := want(res, 0); err != nil {
			return err
		}
		st, _, err := s.status(ctx, agentBranch, statusKeys())
		if err != nil {
			return err
		}
		if st.AgentCLI != "claude" {
			return failf(nil, "status says agent_cli %q, want claude", st.AgentCLI)
		}
		return s.allowPackageSources(ctx, agentBranch) // npm install
	})
	s.Step(ctx, "an unknown --agent is refused, naming the known ones", func() error {
		res := s.tryCreate(ctx, rp.Dir, "--agent", "clippy", "--branch", agentBranch+"-x")
		if err := want(res, 1); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, `"clippy"`) || !strings.Contains(res.Stderr, "claude, codex, gemini") {
			return failf(res, "the refusal does not name the input and the known agents")
		}
		return nil
	})
	s.Step(ctx, "start boots it and installs the agent on the first boot", func() error {
		// start waits for the first boot's setup (cloud-init, which runs
		// the npm install) within its --timeout; past it, start still
		// succeeds with a warning and the install goes on in the guest.
		// That is a start that did not see the agent installed: said here,
		// not as a missing claude in the next step.
		res, err := s.bootFor(ctx, "start", agentBranch, s.bootTimeout(1)+agentInstallTimeout*s.scale)
		if err != nil {
			return err
		}
		if strings.Contains(res.Stderr, "setup to finish") {
			return failf(res, "start returned before the guest's first-boot setup (the npm install of the agent) finished")
		}
		return nil
	})
	s.Step(ctx, "claude --version runs in the guest", func() error {
		res, err := s.execOK(ctx, agentBranch, "claude", "--version")
		if err != nil {
			return err
		}
		if !strings.Contains(res.Stdout, "Claude Code") {
			return failf(res, "claude --version printed %q", strings.TrimSpace(res.Stdout))
		}
		s.notef("%s", strings.TrimSpace(res.Stdout))
		return nil
	})
	s.Step(ctx, "destroy --force removes it", func() error {
		_, err := s.ok(ctx, "destroy", "--force", agentBranch)
		return err
	})
}
