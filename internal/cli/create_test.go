package cli

import (
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// create takes BRANCH as every other verb does; --branch stays, and the
// two must agree.
func TestCreateTakesBRANCH(t *testing.T) {
	repo := tu.Repo(t, false)
	st := t.TempDir()
	for _, args := range [][]string{
		{"create", "pos", "--backend", "qemu"},
		{"create", "--backend", "qemu", "--branch", "flag"},
		{"create", "both", "--branch", "both", "--backend", "qemu"},
	} {
		mustRun(t, repo, st, args...)
	}
	r := mustRun(t, "", st, "list")
	for _, b := range []string{"pos", "flag", "both"} {
		if !strings.Contains(r.stdout, b) {
			t.Errorf("no VM for branch %s:\n%s", b, r.stdout)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "a", "--branch", "b"}, `create got BRANCH "a" and --branch "b"`},
		{[]string{"create", "a", "b"}, "create takes at most one BRANCH, got 2 arguments"},
		{[]string{"create", ""}, "create: BRANCH is empty"},
	} {
		r := agentVM(t, repo, st, append(c.args, "--backend", "qemu")...)
		if r.code != cmdline.ExitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agent-vm %q: exit %d, want %d and %q\n%s", c.args, r.code, cmdline.ExitUsage, c.want, r.stderr)
		}
	}
}
