package main

// Tests of the integration-test binary itself, as a user runs it: built
// from this tree together with agent-vm, run as real processes against the
// real agent-vm. Nothing here fakes agent-vm.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
)

// bins are the binaries TestMain builds: agent-vm and integration-test,
// side by side in one directory, as a user installs them.
type bins struct {
	dir, agentVM, itest string
}

func buildBinaries(dir string) (bins, error) {
	b := bins{dir: dir, agentVM: filepath.Join(dir, "agent-vm"), itest: filepath.Join(dir, "integration-test")}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return b, fmt.Errorf("go is not on PATH: %w", err)
	}
	for out, pkg := range map[string]string{b.agentVM: "../agent-vm", b.itest: "."} {
		cmd := exec.Command(goBin, "build", "-tags", "agentvm_testhooks", "-o", out, pkg)
		if msg, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go build %s: %v\n%s", pkg, err, msg)
		}
	}
	return b, nil
}

// testBins is set once by TestMain, before any test runs.
var testBins bins

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "itest-bins-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testBins, err = buildBinaries(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// itestRun is one finished run of the integration-test binary.
type itestRun struct {
	stdout, stderr string
	code           int
	tmp            string // its TMPDIR: where its temporary directories went
}

// itestEnv is the environment of an integration-test run: ours, with a
// TMPDIR of the test's own (to see that the run removes what it made) and
// without settings that would change what it does.
func itestEnv(tmp string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "TMPDIR", "AGENT_VM_STATE_DIR", blackbox.StrictEnv, "NO_COLOR":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "TMPDIR="+tmp)
}

// runITest runs integration-test with args to the end.
func runITest(t *testing.T, args ...string) itestRun {
	t.Helper()
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testBins.itest, args...)
	cmd.Env = itestEnv(tmp)
	cmd.Dir = tmp
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := itestRun{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode(), tmp: tmp}
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("running integration-test %q: %v", args, err)
	}
	return r
}

// closingLine is the run's last line.
func (r itestRun) closingLine() string { return harness.LastLine(r.stdout) }

// leftovers lists what the run left in its TMPDIR. agent-vm's per-user
// socket directory (agent-vm-<uid>, made when a state directory's paths are
// too long for unix sockets) is kept on purpose, like /run/user/<uid>; it
// counts only when something is left inside it.
func (r itestRun) leftovers(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(r.tmp)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Name() == fmt.Sprintf("agent-vm-%d", os.Geteuid()) {
			inside, _ := os.ReadDir(filepath.Join(r.tmp, e.Name()))
			for _, x := range inside {
				out = append(out, filepath.Join(e.Name(), x.Name()))
			}
			continue
		}
		out = append(out, e.Name())
	}
	return out
}

func (r itestRun) dump(t *testing.T) {
	t.Helper()
	t.Logf("exit status %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// requireCreate skips (or, strict, fails) when this tree's agent-vm cannot
// create a VM record at all (no backend wired into the CLI yet), since the
// cli scenario starts with create.
func requireCreate(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	rp, err := harness.NewRepo(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testBins.agentVM, "--state-dir", filepath.Join(dir, "state"), "create", "probe")
	cmd.Dir = rp.Dir
	out, err := cmd.CombinedOutput()
	if err != nil && bytes.Contains(out, []byte("unknown backend")) {
		blackbox.SkipOrFail(t, "this tree's agent-vm cannot create a VM record yet: %s", bytes.TrimSpace(out))
	}
}

func TestCLIScenarioPasses(t *testing.T) {
	requireCreate(t)
	// No --agent-vm: the agent-vm beside integration-test is the one used.
	r := runITest(t, "--run", "^cli$")
	if r.code != harness.ExitPassed || r.closingLine() != "1 passed, 0 failed, 0 skipped" {
		r.dump(t)
		t.Fatalf("exit status %d, closing line %q; want 0 and %q", r.code, r.closingLine(), "1 passed, 0 failed, 0 skipped")
	}
	if want := "agent-vm   " + testBins.agentVM + " ("; !strings.Contains(r.stdout, want) {
		t.Errorf("the header does not name the agent-vm beside integration-test (%q)", want)
	}
	if left := r.leftovers(t); len(left) > 0 {
		t.Errorf("the run left %q in its TMPDIR", left)
	}
}

func TestFailingScenarioExits1AndShowsTheCommand(t *testing.T) {
	// A real failure from the real agent-vm: the cli scenario's create
	// finds an unreadable VM directory in its way.
	r := runITest(t, "--agent-vm", testBins.agentVM, "--run", "^cli$", "--state-dir", blockedStateDir(t))
	if r.code != harness.ExitFailed {
		r.dump(t)
		t.Fatalf("exit status %d, want %d", r.code, harness.ExitFailed)
	}
	if got, want := r.closingLine(), "0 passed, 1 failed, 0 skipped"; got != want {
		r.dump(t)
		t.Fatalf("closing line %q, want %q", got, want)
	}
	for _, want := range []string{
		harness.MarkFail + " create a VM for a new branch",
		"create itest/cli", // the failing command line, to run again
		"exit status 1",    // its exit code
		"stderr:",          // and what it said
		"is not valid JSON",
		harness.MarkSkip + " list shows it", // later steps are shown as not run
		harness.MarkPass + " clean up",
	} {
		if !strings.Contains(r.stdout, want) {
			r.dump(t)
			t.Fatalf("the output lacks %q", want)
		}
	}
	if left := r.leftovers(t); len(left) > 0 {
		t.Errorf("the run left %q in its TMPDIR", left)
	}
}

// blockedStateDir is a state directory in which the cli scenario's create
// fails for real: the directory its VM would get holds a broken record.
func blockedStateDir(t *testing.T) string {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "itest-cli"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "itest-cli", "config.json"), []byte("not json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestKeepKeepsAFailedScenario(t *testing.T) {
	r := runITest(t, "--agent-vm", testBins.agentVM, "--run", "^cli$", "--state-dir", blockedStateDir(t), "--keep")
	if r.code != harness.ExitFailed {
		r.dump(t)
		t.Fatalf("exit status %d, want %d", r.code, harness.ExitFailed)
	}
	left := r.leftovers(t)
	if len(left) != 1 || !strings.HasPrefix(left[0], "agent-vm-itest-") {
		r.dump(t)
		t.Fatalf("TMPDIR holds %q, want the run's kept directory", left)
	}
	kept := filepath.Join(r.tmp, left[0])
	if !strings.Contains(r.stdout, "kept for debugging") || !strings.Contains(r.stdout, kept) {
		r.dump(t)
		t.Fatalf("the output does not say what was kept where (%s)", kept)
	}
	if !harness.IsDir(filepath.Join(kept, "cli", "src", ".git")) {
		t.Errorf("the failed scenario's repository is not in %s", kept)
	}
}

func TestNoMatchingScenario(t *testing.T) {
	r := runITest(t, "--agent-vm", testBins.agentVM, "--run", "no-such-scenario")
	if r.code != harness.ExitUsage {
		r.dump(t)
		t.Fatalf("exit status %d, want %d", r.code, harness.ExitUsage)
	}
	var names []string
	for _, sc := range suite().Scenarios {
		names = append(names, sc.Name)
	}
	if !strings.Contains(r.stderr, `no scenario matches --run "no-such-scenario"`) || !strings.Contains(r.stderr, strings.Join(names, ", ")) {
		t.Errorf("stderr %q does not say that nothing matches and what the scenarios are", r.stderr)
	}
	if left := r.leftovers(t); len(left) > 0 {
		t.Errorf("the run left %q in its TMPDIR", left)
	}
}

func TestUsageAndExitCodes(t *testing.T) {
	for _, c := range []struct {
		args    []string
		code    int
		mention string
	}{
		{[]string{"--bogus"}, harness.ExitUsage, "-bogus"},
		{[]string{"--run", "["}, harness.ExitUsage, "not a regular expression"},
		{[]string{"--stall", "0s"}, harness.ExitUsage, "--stall"},
		{[]string{"--backend", "docker"}, harness.ExitUsage, `"docker"`},
		{[]string{"cli"}, harness.ExitUsage, "--run REGEX"},
		{[]string{"-h"}, harness.ExitPassed, "usage: integration-test"},
		{[]string{"--agent-vm", "/nonexistent/agent-vm", "--run", "cli"}, harness.ExitFailed, "not an executable file"},
		{[]string{"--agent-vm", "/bin/false", "--run", "cli"}, harness.ExitFailed, "agent-vm at /bin/false does not run"},
	} {
		r := runITest(t, c.args...)
		if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.mention) {
			r.dump(t)
			t.Errorf("integration-test %q: exit status %d, want %d, with %q said", c.args, r.code, c.code, c.mention)
		}
	}
}

func TestList(t *testing.T) {
	r := runITest(t, "--list")
	if r.code != harness.ExitPassed {
		r.dump(t)
		t.Fatalf("exit status %d", r.code)
	}
	for _, sc := range suite().Scenarios {
		if !strings.Contains(r.stdout, sc.Name+" ") || !strings.Contains(r.stdout, sc.Summary) {
			t.Errorf("--list does not describe %q:\n%s", sc.Name, r.stdout)
		}
	}
}
