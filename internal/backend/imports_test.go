package backend_test

import (
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestNoBackendImportsAnother keeps the backends apart: what two need
// (the Debian guest's seed) is a package of its own that both import. A
// backend is a package that checks at compile time that it implements
// backend.Backend.
func TestNoBackendImportsAnother(t *testing.T) {
	tu.Apart(t, "backend", "backend", "Backend", 3)
}
