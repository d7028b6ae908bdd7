package cloudinit

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

func readFixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "keys", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// testConfig is a valid Config built from the test keys.
func testConfig(t testing.TB) Config {
	t.Helper()
	return Config{
		InstanceID:     "feat-x-1",
		Hostname:       "feat-x",
		UID:            1000,
		GID:            1000,
		AuthorizedKeys: []string{strings.TrimSpace(readFixture(t, "user_ed25519.pub"))},
		HostKey: HostKey{
			Private: readFixture(t, "host_ed25519"),
			Public:  strings.TrimSpace(readFixture(t, "host_ed25519.pub")),
		},
	}
}

// agentBinary returns an x86-64 executable to stand in for agent-vm: the
// test binary itself.
func agentBinary(t testing.TB) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkAgentBinary(exe); err != nil {
		testutil.SkipOrFail(t, "the test binary cannot stand in for agent-vm here: %v", err)
	}
	return exe
}

var seedTime = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func runTool(t testing.TB, path string, args ...string) (string, string) {
	t.Helper()
	res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: path, Args: args})
	if err != nil {
		t.Fatalf("%v", err)
	}
	return string(res.Stdout), string(res.Stderr)
}
