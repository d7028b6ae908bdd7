package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// fakeAptPath is a PATH holding only a FAKE apt-get and apt-cache (shell
// scripts at the exec boundary) that record each call in log, and fail
// with apt's own words when fail is set.
func fakeAptPath(t *testing.T, fail bool) (dir, log string) {
	dir = t.TempDir()
	log = filepath.Join(dir, "calls.log")
	body := "#!/bin/sh\necho \"$0 $*\" >> " + log + "\n"
	if fail {
		body += "echo 'E: Unable to locate package qemu-system-x86' >&2\nexit 100\n"
	}
	for _, name := range []string{"apt-get", "apt-cache"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir, log
}

// runSetup runs the built agent-vm with only dir on PATH and no terminal.
func runSetup(t *testing.T, path string, args ...string) (string, int) {
	t.Helper()
	tu.Program(t, "sh") // the fakes are /bin/sh scripts
	cmd := exec.Command(tu.AgentVMBinary(t), append([]string{"--state-dir", t.TempDir(), "setup"}, args...)...)
	cmd.Env = []string{"PATH=" + path, "HOME=" + t.TempDir(), "NO_COLOR=1"}
	cmd.Stdin = nil // /dev/null: not a terminal
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func TestSetupWithoutATerminalOrYesChangesNothing(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "runs as root: as a user, setup stops earlier, printing the sudo command (covered in internal/vm)")
	dir, log := fakeAptPath(t, false)
	out, code := runSetup(t, dir)
	if code != 1 || !strings.Contains(out, "nothing was installed or built") || !strings.Contains(out, "agent-vm setup --yes") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
	calls, _ := os.ReadFile(log)
	if strings.Contains(string(calls), "apt-get") {
		t.Errorf("apt-get ran without consent:\n%s", calls)
	}
}

func TestSetupYesReportsAFailingPackageManager(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "needs root: installing is what is tested")
	dir, log := fakeAptPath(t, true)
	out, code := runSetup(t, dir, "--yes")
	if code != 1 || !strings.Contains(out, "Unable to locate package") || !strings.Contains(out, "+ apt-get update -q") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
	if calls, _ := os.ReadFile(log); !strings.Contains(string(calls), "apt-get update -q") {
		t.Errorf("apt-get calls:\n%s", calls)
	}
}

func TestSetupCheckNamesWhatIsMissing(t *testing.T) {
	dir, _ := fakeAptPath(t, false)
	out, code := runSetup(t, dir, "--check", "--tests")
	if code != 1 || !strings.Contains(out, "--  git") || !strings.Contains(out, "missing (Debian package git)") ||
		!strings.Contains(out, "agent-vm setup --tests") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
}
