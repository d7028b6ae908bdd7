package driver_test

import (
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestNoDriverImportsAnother keeps the drivers apart: each runs machines
// its own way, and what two need (virtiofsd, the process table) is a
// package of its own that both import. A driver is a package that checks
// at compile time that it implements driver.Driver.
func TestNoDriverImportsAnother(t *testing.T) {
	tu.Apart(t, "driver", "driver", "Driver", 2)
}
