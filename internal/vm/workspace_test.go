package vm_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// guestWait is a guest script that evaluates the shell condition $1 until
// it holds (every 0.1 s, for at most about 2 minutes) and prints how long
// that took by the guest's clock.
const guestWait = `t0=$(date +%s.%N); i=0
while ! eval "$1"; do i=$((i+1)); if [ $i -ge 1200 ]; then echo "still false: $1"; exit 1; fi; sleep 0.1; done
echo "$t0 $(date +%s.%N)"`

// The workspace share, in the default cache mode, shows the guest what
// the host does to the workspace (a new file, an edit, a rename, a
// deletion), each after the guest has cached the old state (read the
// file, looked up the missing name), and the host what the guest does.
// The documented delay for cache=auto is about a second (the entry and
// attribute timeout); the test waits up to 2 minutes for each change (TCG
// on a busy host) and logs how long the guest took to see it: timings are
// bench's (P6), not this test's. TestNewHost runs it on its running qemu
// VM e after lifecycle, which saves a boot.
func workspaceCoherence(t *testing.T, m *vm.Manager, e state.Entry) {
	info := m.Status(context.Background(), e, false)
	t.Logf("workspace over %s, cache %s", info.Share, info.ShareCache)
	branch := e.Record.Branch
	ws := e.Layout.Workspace()
	host := func(what string, do func() error) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("host: %s: %v", what, err)
		}
	}
	write := func(name, content string) func() error {
		return func() error { return os.WriteFile(filepath.Join(ws, name), []byte(content), 0o644) }
	}
	guest := func(script string) string {
		t.Helper()
		code, out, errOut := run(t, m, branch, "sh", "-c", script)
		if code != 0 {
			t.Fatalf("guest `%s`: exit %d: %s%s", script, code, out, errOut)
		}
		return out
	}
	seen := func(what, cond string) {
		t.Helper()
		code, out, errOut := run(t, m, branch, "sh", "-c", guestWait, "sh", cond)
		if code != 0 {
			t.Errorf("the guest did not see the host's %s: %s%s", what, out, errOut)
			return
		}
		var t0, t1 float64
		if f := strings.Fields(out); len(f) == 2 {
			t0, t1 = parseFloat(f[0]), parseFloat(f[1])
		}
		t.Logf("guest saw the host's %s after %.2f s", what, t1-t0)
	}

	// Prime the guest's caches: the file's content and attributes, the
	// names that do not exist yet.
	host("write edit.txt", write("edit.txt", "aaaa\n"))
	host("write gone.txt", write("gone.txt", "gone\n"))
	host("write old.txt", write("old.txt", "old\n"))
	seen("first files", `[ -f /workspace/edit.txt ] && [ -f /workspace/gone.txt ] && [ -f /workspace/old.txt ]`)
	guest(`cat /workspace/edit.txt /workspace/old.txt >/dev/null; stat /workspace/gone.txt >/dev/null; ls /workspace >/dev/null
test ! -e /workspace/new.txt && test ! -e /workspace/renamed.txt`)

	// An edit of the same size within the same second, as an editor's
	// save can be.
	host("edit edit.txt", write("edit.txt", "bbbb\n"))
	seen("edit", `[ "$(cat /workspace/edit.txt)" = bbbb ]`)
	host("create new.txt", write("new.txt", "new\n"))
	seen("new file", `[ "$(cat /workspace/new.txt 2>/dev/null)" = new ]`)
	host("rename old.txt", func() error { return os.Rename(filepath.Join(ws, "old.txt"), filepath.Join(ws, "renamed.txt")) })
	seen("rename", `[ ! -e /workspace/old.txt ] && [ "$(cat /workspace/renamed.txt 2>/dev/null)" = old ]`)
	host("delete gone.txt", func() error { return os.Remove(filepath.Join(ws, "gone.txt")) })
	seen("deletion", `[ ! -e /workspace/gone.txt ] && ! ls /workspace | grep -qx gone.txt`)

	// The guest's changes reach the host by the time its commands return
	// (the host still waits, not to fail on a slow page-out).
	host("write dropped.txt", write("dropped.txt", "x\n"))
	seen("dropped.txt", `[ -f /workspace/dropped.txt ]`)
	guest(`set -e; cd /workspace; echo guest > g1.txt; mv g1.txt g2.txt; echo more >> g2.txt; rm dropped.txt; mkdir -p gdir; echo deep > gdir/f`)
	checks := map[string]func() bool{
		"g2.txt says guest, more": func() bool {
			b, err := os.ReadFile(filepath.Join(ws, "g2.txt"))
			return err == nil && string(b) == "guest\nmore\n"
		},
		"g1.txt is gone":      func() bool { _, err := os.Lstat(filepath.Join(ws, "g1.txt")); return os.IsNotExist(err) },
		"dropped.txt is gone": func() bool { _, err := os.Lstat(filepath.Join(ws, "dropped.txt")); return os.IsNotExist(err) },
		"gdir/f says deep": func() bool {
			b, err := os.ReadFile(filepath.Join(ws, "gdir", "f"))
			return err == nil && string(b) == "deep\n"
		},
	}
	for what, ok := range checks {
		tu.WaitFor(t, "the host to see the guest's change: "+what, ok)
	}
}

func parseFloat(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
}
