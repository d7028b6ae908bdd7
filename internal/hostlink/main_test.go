package hostlink

import (
	"os"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestMain removes the agent-vm binary the tests built (the one Start runs
// on the host), once they are done.
func TestMain(m *testing.M) {
	code := m.Run()
	tu.RemoveAgentVMBinary()
	os.Exit(code)
}
