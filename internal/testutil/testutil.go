// Package testutil holds helpers shared by tests: real git repositories in
// temp dirs, the programs tests run with the skip-or-fail rule for missing
// ones (Program, Need, SkipOrFail; a test checks that every skip keeps
// it), the one wait for a condition (Poll, and WaitFor for VM work),
// golden files, git over HTTP (GitHTTP)
// and an HTTPS server outside the host, in a network namespace of its own
// (NewUpstream). Only tests import it.
// Test code that must not import internal/ (integration/, bench/) uses
// blackbox, where the skip-or-fail rule is written once.
package testutil

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
)

// Need skips the test with reason, or fails it under AGENT_VM_TEST_STRICT=1
// (CI sets it, so nothing is skipped silently there). The rule itself is
// written once, in blackbox, which the black-box tests share.
func Need(t testing.TB, ok bool, reason string) {
	t.Helper()
	blackbox.Need(t, ok, reason)
}

// SkipOrFail skips the test with the formatted reason, or fails it under
// AGENT_VM_TEST_STRICT=1: Need for a prerequisite already found missing.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	blackbox.SkipOrFail(t, format, args...)
}

// Program returns the path of an external program a test runs, and skips
// the test (or fails it under AGENT_VM_TEST_STRICT=1) when it is missing.
// Every program a test runs is named here: it must be on hostpkgs' list,
// which knows its package, and which `agent-vm setup --tests` (README's test
// command, CI) installs. A program not on the list fails the test.
func Program(t testing.TB, name string) string {
	t.Helper()
	p, err := hostpkgs.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	path, ok := hostpkgs.Host{Run: execx.OS{}}.Find(p)
	Need(t, ok, fmt.Sprintf("%s is not installed (%s; `go run ./cmd/agent-vm setup --tests` installs it)", name, p.PackageHint()))
	return path
}

// gitEnv gives tests a fixed identity and isolates them from the user's
// git configuration.
func gitEnv(home string) []string {
	return append(os.Environ(),
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com",
		"GIT_CONFIG_NOSYSTEM=1", "HOME="+home, "LC_ALL=C")
}

// Git runs git in dir and returns its trimmed output, failing the test on error.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	// Workspaces of root-run tests belong to the guest uid (see design.md),
	// which git would otherwise refuse as "dubious ownership".
	cmd := exec.Command("git", append([]string{"-c", "safe.directory=*", "-C", dir}, args...)...)
	cmd.Env = gitEnv(filepath.Dir(dir))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Repo makes a git repository with one commit on branch main, and returns
// its path. With remote set, the repo gets an origin (a bare repo beside it).
func Repo(t testing.TB, remote bool) string {
	t.Helper()
	Program(t, "git")
	base := t.TempDir()
	dir := filepath.Join(base, "project")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	Git(t, dir, "init", "--quiet", "--initial-branch=main")
	WriteFile(t, filepath.Join(dir, "README.md"), "hello\n")
	Git(t, dir, "add", ".")
	Git(t, dir, "commit", "--quiet", "-m", "first")
	if remote {
		bare := filepath.Join(base, "remote.git")
		Git(t, base, "init", "--quiet", "--bare", bare)
		Git(t, dir, "remote", "add", "origin", bare)
		Git(t, dir, "push", "--quiet", "origin", "main")
	}
	return dir
}

// WriteFile writes a file, failing the test on error.
func WriteFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// FreePort is a TCP port on 127.0.0.1 that nothing listens on right now
// (the kernel's pick, from its ephemeral range, which on a usual host lies
// above the ranges agent-vm picks a VM's ports from).
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Kernel returns a Linux kernel (bzImage) for tests that boot one: the file
// named by AGENT_VM_TEST_KERNEL, or one from a base image agent-vm built
// into the cache. It skips (or fails under AGENT_VM_TEST_STRICT=1) when none.
func Kernel(t testing.TB) string {
	t.Helper()
	if k := os.Getenv("AGENT_VM_TEST_KERNEL"); k != "" {
		return k
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	matches, _ := filepath.Glob(filepath.Join(cache, "agent-vm", "images", "*", "vmlinuz*"))
	Need(t, len(matches) > 0, "no Linux kernel to boot: run `agent-vm image build` or set AGENT_VM_TEST_KERNEL")
	return matches[0]
}

var agentVM struct {
	once sync.Once
	path string
	err  error
}

// AgentVMBinary builds agent-vm once per test binary, statically
// (CGO_ENABLED=0: guests run the same file as agent-mcp) and with the
// egress proxy's test hooks (the agentvm_testhooks tag: egress.TestHooks),
// for tests that need it as a real process. Call RemoveAgentVMBinary from TestMain after
// the tests have run.
func AgentVMBinary(t testing.TB) string {
	t.Helper()
	agentVM.once.Do(func() {
		dir, err := os.MkdirTemp("", "agent-vm-bin-")
		if err != nil {
			agentVM.err = err
			return
		}
		agentVM.path = filepath.Join(dir, "agent-vm")
		cmd := exec.Command("go", "build", "-tags", "agentvm_testhooks", "-o", agentVM.path, "github.com/agent-vm/agent-vm/cmd/agent-vm")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentVM.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if agentVM.err != nil {
		t.Fatal(agentVM.err)
	}
	return agentVM.path
}

// RemoveAgentVMBinary removes what AgentVMBinary built, if anything.
func RemoveAgentVMBinary() {
	if agentVM.path != "" {
		os.RemoveAll(filepath.Dir(agentVM.path))
	}
}
