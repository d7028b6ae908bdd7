package scenario

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/integration/harness"
)

// The repository's own provisioning, as the lifecycle scenario gives it:
// a package from .agent-vm/config.toml (GNU hello: in Debian and nixpkgs
// alike) and a provision.sh that uses it and writes a marker outside the
// workspace. provisionFail is what the workspace's script becomes before
// reset, so the fresh disk's provisioning fails, and provisionReset its
// config: reset reads the repository's packages again, so the fresh disk
// has no hello (and its first boot no apt run, minutes under TCG).
var provisionFiles = map[string]string{
	".agent-vm/config.toml": "# the lifecycle scenario's provisioning\npackages = [\n  \"hello\",\n]\n",
	".agent-vm/provision.sh": "#!/bin/sh\nset -eu\nmkdir -p /opt/itest\n" +
		"hello >/opt/itest/provisioned\necho \"itest: provisioned as $(id -un)\"\n",
}

const (
	provisionMarker = "/opt/itest/provisioned"
	provisionFail   = "#!/bin/sh\necho 'itest: this provisioning fails on purpose' >&2\nexit 3\n"
	provisionReset  = "# the lifecycle scenario's provisioning, its package dropped before reset\n"
	outsideFile     = "/home/dev/outside-workspace.txt"
	keptFile        = "kept-across-reset.txt"
)

// checkProvisioned: the first boot installed the config's package and ran
// provision.sh as root, which wrote its marker outside the workspace.
func checkProvisioned(ctx context.Context, s *harness.S, branch string) error {
	res, err := s.ExecOK(ctx, branch, "hello")
	if err != nil {
		return err
	}
	if !strings.Contains(res.Stdout, "Hello, world!") {
		return harness.Failf(res, "the config's package hello printed %q", res.Stdout)
	}
	if res, err = s.ExecOK(ctx, branch, "cat", provisionMarker); err != nil {
		return err
	}
	if !strings.Contains(res.Stdout, "Hello, world!") {
		return harness.Failf(res, "provision.sh's marker %s holds %q", provisionMarker, res.Stdout)
	}
	res, err = s.OK(ctx, "logs", "-n", "50", branch)
	if err != nil {
		return err
	}
	if !strings.Contains(res.Stdout, "itest: provisioned as root") {
		return harness.Failf(res, "`agent-vm logs` does not show provision.sh's output")
	}
	return nil
}

// resetRefusesRunning: reset will not pull the disk from under a running VM.
func resetRefusesRunning(ctx context.Context, s *harness.S, branch string) error {
	res := s.AgentVM(ctx, "reset", branch)
	if err := harness.Want(res, 1); err != nil {
		return err
	}
	if !strings.Contains(res.Stderr, "agent-vm stop") || !strings.Contains(res.Stderr, "--force") {
		return harness.Failf(res, "the refusal does not say to stop the VM or pass --force")
	}
	_, err := s.Healthy(ctx, branch)
	return err
}

// resetWithFailingProvision leaves a file outside the workspace and an
// uncommitted one in it, makes the workspace's provision.sh fail, resets
// the running VM (--force) and starts it: the start fails with the
// provisioning's log tail. It returns the known_hosts it had before.
func resetWithFailingProvision(ctx context.Context, s *harness.S, branch string) (knownHosts string, err error) {
	st, _, err := s.Status(ctx, branch, harness.RunningKeys())
	if err != nil {
		return "", err
	}
	raw, err := os.ReadFile(st.SSH.KnownHostsFile)
	if err != nil {
		return "", harness.Failf(nil, "reading the VM's known_hosts: %v", err)
	}
	if _, err := s.ExecOK(ctx, branch, "sh", "-c", "echo outside >"+outsideFile); err != nil {
		return "", err
	}
	ws := st.Paths.Workspace
	if err := os.WriteFile(filepath.Join(ws, keptFile), []byte("uncommitted\n"), 0o644); err != nil {
		return "", harness.Failf(nil, "writing into the workspace: %v", err)
	}
	for name, body := range map[string]string{"provision.sh": provisionFail, "config.toml": provisionReset} {
		if err := os.WriteFile(filepath.Join(ws, ".agent-vm", name), []byte(body), 0o644); err != nil {
			return "", harness.Failf(nil, "writing into the workspace: %v", err)
		}
	}
	if _, err := s.OK(ctx, "reset", "--force", branch); err != nil {
		return "", err
	}
	res, _ := s.Start(ctx, branch)
	if err := harness.Want(res, 1); err != nil {
		return "", err
	}
	for _, w := range []string{"itest: this provisioning fails on purpose", "exit status 3", "agent-vm reset"} {
		if !strings.Contains(res.Stderr, w) {
			return "", harness.Failf(res, "the failed start does not say %q", w)
		}
	}
	return string(raw), nil
}

// checkAfterReset: the VM answers SSH with the same pinned host key, the
// workspace's uncommitted file is there, and what was outside it is gone:
// the files and the package the first disk's provisioning installed (the
// config reset read no longer names it).
func checkAfterReset(ctx context.Context, s *harness.S, branch, knownHosts string) error {
	st, err := s.Healthy(ctx, branch)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(st.SSH.KnownHostsFile)
	if err != nil || string(raw) != knownHosts {
		return harness.Failf(nil, "the VM's known_hosts changed across the reset (%v)", err)
	}
	res, err := s.ExecOK(ctx, branch, "cat", keptFile)
	if err != nil {
		return err
	}
	if strings.TrimSpace(res.Stdout) != "uncommitted" {
		return harness.Failf(res, "the workspace's uncommitted %s holds %q after reset", keptFile, res.Stdout)
	}
	for _, gone := range []string{outsideFile, provisionMarker} {
		if res := s.Exec(ctx, branch, "test", "!", "-e", gone); res.ExitCode != 0 {
			return harness.Failf(res, "%s, outside the workspace, survived the reset", gone)
		}
	}
	if res := s.Exec(ctx, branch, "sh", "-c", "command -v hello"); res.ExitCode == 0 {
		return harness.Failf(res, "hello, which config.toml no longer names, is installed after the reset")
	}
	return nil
}
