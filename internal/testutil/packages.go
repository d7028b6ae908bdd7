package testutil

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Package is one of the module's packages as `go list` sees its non-test
// files: for the import-ban tests.
type Package struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string // its own imports
	Deps       []string // everything it imports, directly or not
}

// Packages lists the module's packages (`go list -json` of the module's
// tree).
func Packages(t testing.TB) []Package {
	t.Helper()
	gobin := Program(t, "go")
	mod, err := exec.Command(gobin, "list", "-m").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-json", strings.TrimSpace(string(mod))+"/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []Package
	for dec := json.NewDecoder(strings.NewReader(string(out))); ; {
		var p Package
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("reading go list's answer: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list named %d packages, so what is checked against them proves nothing", len(pkgs))
	}
	return pkgs
}

// Implementing returns the import paths of the packages among pkgs that
// check at compile time that they implement the interface iface of the
// package named pkg ("driver", "Driver": var _ driver.Driver = ...): the
// drivers, the backends.
func Implementing(t testing.TB, pkgs []Package, pkg, iface string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, p := range pkgs {
		if CompileChecks(t, p, pkg)[iface] {
			out[p.ImportPath] = true
		}
	}
	return out
}

// CompileChecks are the interfaces of the package named pkg that p checks
// at compile time that it implements: var _ pkg.X = ...
func CompileChecks(t testing.TB, p Package, pkg string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, f := range p.GoFiles {
		parsed, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range parsed.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				v := s.(*ast.ValueSpec)
				sel, ok := v.Type.(*ast.SelectorExpr)
				if !ok || len(v.Names) != 1 || v.Names[0].Name != "_" {
					continue
				}
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == pkg {
					out[sel.Sel.Name] = true
				}
			}
		}
	}
	return out
}

// Apart checks that no package implementing pkg.iface (see Implementing)
// depends, directly or not, on another; finding fewer than least of them
// fails the test, which would prove nothing. kind names them in the
// errors: "driver".
func Apart(t testing.TB, kind, pkg, iface string, least int) {
	t.Helper()
	pkgs := Packages(t)
	impls := Implementing(t, pkgs, pkg, iface)
	if len(impls) < least {
		t.Fatalf("found %d %ss (%v): the check proves nothing", len(impls), kind, impls)
	}
	for _, p := range pkgs {
		if !impls[p.ImportPath] {
			continue
		}
		for _, d := range p.Deps {
			if impls[d] {
				t.Errorf("the %s %s imports the %[1]s %s; move what both need into a package of its own", kind, p.ImportPath, d)
			}
		}
	}
}
