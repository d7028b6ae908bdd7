package vm

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyOpenKnowsQEMU keeps the driver seam: the orchestration runs
// machines through internal/driver, and only the composition root (open.go)
// imports the QEMU driver, to build it. Tests may reach it (fakes).
func TestOnlyOpenKnowsQEMU(t *testing.T) {
	const qemuPkg = "github.com/agent-vm/agent-vm/internal/qemu"
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		imports := false
		for _, imp := range parsed.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == qemuPkg {
				imports = true
			}
		}
		switch {
		case f == "open.go" && !imports:
			t.Errorf("open.go no longer imports %s: if the QEMU driver is built elsewhere now, update this test", qemuPkg)
		case f != "open.go" && imports:
			t.Errorf("%s imports %s; use the driver contract (internal/driver), and build drivers in open.go", f, qemuPkg)
		}
		seen++
	}
	if seen < 10 {
		t.Fatalf("looked at %d files only, so the check proves nothing", seen)
	}
}
