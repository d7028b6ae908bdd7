package vm

import (
	"go/parser"
	"go/token"
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestOnlyOpenKnowsDriversAndBackends keeps both seams: the orchestration
// runs machines through internal/driver and guests through
// internal/backend; only the composition root (open.go) imports the
// drivers and the backends (every package with a compile-time check of
// driver.Driver or backend.Backend), to build them, and no file of vm
// imports what only they use. Tests may reach them (fakes).
func TestOnlyOpenKnowsDriversAndBackends(t *testing.T) {
	const module = "github.com/agent-vm/agent-vm/internal/"
	concrete := map[string]bool{module + "qemu": true, module + "qmp": true, module + "debian": true,
		module + "nixos": true, module + "cloudinit": true, module + "vagrant": true, module + "vagrantbackend": true,
		module + "vagrantbox": true, module + "seed": true, module + "virtiofsd": true, module + "sharejail": true}
	pkgs := tu.Packages(t)
	maps.Copy(concrete, tu.Implementing(t, pkgs, "driver", "Driver"))
	maps.Copy(concrete, tu.Implementing(t, pkgs, "backend", "Backend"))
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	openImports := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range parsed.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			switch {
			case !concrete[p]:
			case f == "open.go":
				openImports++
			default:
				t.Errorf("%s imports %s; use the contracts (internal/driver, internal/backend), and build drivers and backends in open.go", f, p)
			}
		}
		seen++
	}
	if seen < 10 || openImports < 5 {
		t.Fatalf("looked at %d files, and open.go builds %d concrete drivers/backends: the check proves nothing", seen, openImports)
	}
}
