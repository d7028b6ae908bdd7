package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// create --packages: comma-separated and repeatable, checked per backend
// with the bad name in the message; the record keeps them.
func TestCreatePackages(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	mustRun(t, repo, st, "create", "a", "--backend", "qemu", "--packages", "ripgrep,jq", "--packages", "hello")
	if rec := readRecord(t, st, "a"); !strings.Contains(rec, `"packages": [
    "ripgrep",
    "jq",
    "hello"
  ]`) {
		t.Errorf("the record does not keep --packages in order:\n%s", rec)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--packages", "ripgrep,,jq"}, 2, `--packages "ripgrep,,jq" has an empty name`},
		{[]string{"--packages", "ripgrep,Bad"}, 1, `package name "Bad" is not a Debian package name`},
		{[]string{"--packages", "--force-yes"}, 1, `"--force-yes" is not a Debian package name`},
	} {
		r := agentVM(t, repo, st, append([]string{"create", "b", "--backend", "qemu"}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("create %q: exit %d, want %d with %q\n%s", tc.args, r.code, tc.code, tc.want, r.stderr)
		}
	}
}

// A broken .agent-vm/config.toml fails create with the file and line.
func TestCreateNamesTheBadConfigLine(t *testing.T) {
	repo := tu.Repo(t, true)
	tu.WriteFile(t, filepath.Join(repo, ".agent-vm", "config.toml"), "packages = [\"jq\"]\ncpus = \"many\"\n")
	tu.Git(t, repo, "add", ".")
	tu.Git(t, repo, "commit", "--quiet", "-m", "settings")
	r := agentVM(t, repo, t.TempDir(), "create", "b", "--backend", "qemu")
	if r.code != 1 || !strings.Contains(r.stderr, "b:.agent-vm/config.toml:2: cpus: incompatible types") {
		t.Errorf("exit %d\n%s", r.code, r.stderr)
	}
}

// reset's refusals through the command line: an unknown VM, extra
// arguments.
func TestResetRefusals(t *testing.T) {
	st := t.TempDir()
	if r := agentVM(t, "", st, "reset", "nope"); r.code != 1 || !strings.Contains(r.stderr, "nope") {
		t.Errorf("reset of an unknown VM: exit %d\n%s", r.code, r.stderr)
	}
	if r := agentVM(t, "", st, "reset", "a", "b"); r.code != 2 || !strings.Contains(r.stderr, "at most one BRANCH") {
		t.Errorf("reset a b: exit %d\n%s", r.code, r.stderr)
	}
}

func readRecord(t *testing.T, st, slug string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(st, slug, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
