package archtest

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestTheCapabilitiesTellTheTruth: the page's table of capabilities
// (under "### Capabilities") has a row for every driver and backend (a
// package with a compile-time check of driver.Driver or backend.Backend),
// each naming exactly the optional interfaces of its contract the package
// checks at compile time (var _ driver.Cloner = ...), and no other; every
// optional interface of the two contracts is named by some row or said
// to be had by none.
func TestTheCapabilitiesTellTheTruth(t *testing.T) {
	pkgs := tu.Packages(t)
	mod := modulePath(pkgs)
	rows := readCapabilities(t)
	contracts := map[string]map[string]bool{
		"driver":  interfaces(t, filepath.Join("..", "driver"), "Driver", "Boot"),
		"backend": interfaces(t, filepath.Join("..", "backend"), "Backend"),
	}
	if len(contracts["driver"]) < 5 || len(contracts["backend"]) < 3 {
		t.Fatalf("found the optional interfaces %v: the check proves nothing", contracts)
	}
	named := map[string]bool{}
	impls := 0
	for _, p := range pkgs {
		for contract, core := range map[string]string{"driver": "Driver", "backend": "Backend"} {
			checked := tu.CompileChecks(t, p, contract)
			if !checked[core] {
				continue
			}
			impls++
			rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, mod+"/"), "internal/")
			r, ok := rows[rel]
			if !ok {
				t.Errorf("the %s %s has no row in %s's capability table (hint: add `| `%s` | %s | its capabilities |`)", contract, rel, page, rel, contract)
				continue
			}
			delete(rows, rel)
			var has []string
			for c := range checked {
				if c != core && contracts[contract][c] {
					has = append(has, c)
				}
			}
			slices.Sort(has)
			if r.contract != contract || !slices.Equal(has, r.caps) {
				t.Errorf("%s:%d: %s is a %s with %v (its compile-time checks), the table says a %s with %v", page, r.line, rel, contract, has, r.contract, r.caps)
			}
			for _, c := range has {
				named[contract+"."+c] = true
			}
		}
	}
	for rel, r := range rows {
		t.Errorf("%s:%d: the capability table has a row for %s, which is no driver or backend", page, r.line, rel)
	}
	if impls < 6 {
		t.Fatalf("found %d drivers and backends: the check proves nothing", impls)
	}
	for contract, ifaces := range contracts {
		for c := range ifaces {
			if !named[contract+"."+c] {
				t.Errorf("no %s has %s.%s (hint: a capability no %[1]s has is dead code: remove it, or give it to the %[1]s it was made for)", contract, contract, c)
			}
		}
	}
}

// capRow is a row of the capability table.
type capRow struct {
	contract string
	caps     []string
	line     int
}

// readCapabilities reads the table under "### Capabilities": rows of
// "| `package` | driver or backend | `A`, `B` |" ("none" in the last
// column for a package with none).
func readCapabilities(t *testing.T) map[string]capRow {
	t.Helper()
	f, err := os.Open(page)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]capRow{}
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "#"):
			in = line == "### Capabilities"
			continue
		case !in || !strings.HasPrefix(line, "| `"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("%s:%d: a capability row has %d cells, want 3 (package, contract, capabilities): %s", page, n, len(cells), line)
		}
		r := capRow{contract: strings.TrimSpace(cells[1]), line: n}
		for _, c := range strings.Split(cells[2], ",") {
			if c = strings.Trim(strings.TrimSpace(c), "`"); c != "" && c != "none" {
				r.caps = append(r.caps, c)
			}
		}
		slices.Sort(r.caps)
		rows[strings.Trim(strings.TrimSpace(cells[0]), "`")] = r
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s has no capability table (### Capabilities)", page)
	}
	return rows
}

// interfaces are the exported interface types of the package in dir,
// but the core ones.
func interfaces(t *testing.T, dir string, core ...string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range parsed.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				if _, ok := ts.Type.(*ast.InterfaceType); ok && ts.Name.IsExported() && !slices.Contains(core, ts.Name.Name) {
					out[ts.Name.Name] = true
				}
			}
		}
	}
	return out
}
