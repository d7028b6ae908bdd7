package testutil

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/hostpkgs"
)

// Every program a test runs by name is on hostpkgs' list, so `agent-vm
// setup --tests` installs it and a fresh machine has it. The test reads the
// repository's Go test code (and integration/ and bench/, which drive real
// programs too) and finds each program named by a string literal in
// exec.Command, exec.CommandContext, exec.LookPath, execx.Cmd{Path: ...} and
// Program calls.
func TestTestsRunOnlyListedPrograms(t *testing.T) {
	root := repoRoot(t)
	found := map[string][]string{} // program -> where
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") && !strings.HasPrefix(rel, "integration/") && !strings.HasPrefix(rel, "bench/") {
			return nil
		}
		for prog, pos := range programsNamedIn(t, path) {
			found[prog] = append(found[prog], rel+":"+pos)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < 10 {
		t.Fatalf("found only %d programs named in tests (%v): the scanner is broken", len(found), found)
	}
	for prog, where := range found {
		if filepath.IsAbs(prog) {
			prog = filepath.Base(prog)
		}
		if _, err := hostpkgs.Lookup(prog); err != nil && prog != "agent-vm" && prog != "integration-test" {
			t.Errorf("%v, named at %s", err, strings.Join(where, ", "))
		}
	}
}

// programsNamedIn returns the string literals a file passes as a program to
// run, with a position for each.
func programsNamedIn(t *testing.T, path string) map[string]string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	lit := func(e ast.Expr) {
		if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
			if s, err := strconv.Unquote(b.Value); err == nil && s != "" {
				p := fset.Position(b.Pos())
				out[s] = strconv.Itoa(p.Line)
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || len(n.Args) == 0 {
				return true
			}
			switch sel.Sel.Name {
			case "Command", "LookPath", "Program":
				lit(n.Args[0])
				if sel.Sel.Name == "Program" && len(n.Args) > 1 {
					lit(n.Args[1])
				}
			case "CommandContext":
				if len(n.Args) > 1 {
					lit(n.Args[1])
				}
			}
		case *ast.CompositeLit:
			if sel, ok := n.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Cmd" {
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Path" {
							lit(kv.Value)
						}
					}
				}
			}
		}
		return true
	})
	return out
}

func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}
