package archtest

import (
	"bufio"
	"os"
	"path"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// page is the architecture page, from this package's directory.
const page = "../../docs/ARCHITECTURE.md"

// row is one line of the page's package table.
type row struct {
	name  string   // relative to internal/
	allow []string // the agent-vm packages it may import, as the page names them
	line  int
}

// readTable reads the table under the heading "## Packages": rows of
// "| `name` | what it is for | `a`, `b` |" (or "none" in the last column).
func readTable(t *testing.T) []row {
	t.Helper()
	f, err := os.Open(page)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []row
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Packages"
			continue
		case !in || !strings.HasPrefix(line, "| `"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("%s:%d: a package row has %d cells, want 3 (package, what it is for, may import): %s", page, n, len(cells), line)
		}
		r := row{name: strings.Trim(strings.TrimSpace(cells[0]), "`"), line: n}
		for _, a := range strings.Split(cells[2], ",") {
			if a = strings.Trim(strings.TrimSpace(a), "`"); a != "" && a != "none" {
				r.allow = append(r.allow, a)
			}
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestTheTableTellsTheTruth: every internal package has a row, every row
// and every name a row allows is a package, and no internal package
// imports an agent-vm package its row does not allow. Names are relative
// to internal/, except the module's top-level packages (modules), which
// have no internal/ twin.
func TestTheTableTellsTheTruth(t *testing.T) {
	pkgs := tu.Packages(t)
	mod := modulePath(pkgs)
	if mod == "" {
		t.Fatal("go list named no internal package")
	}
	exists := map[string]bool{}
	for _, p := range pkgs {
		exists[strings.TrimPrefix(p.ImportPath, mod+"/")] = true
	}
	// resolve turns a name of the page into a package path under the module.
	resolve := func(name string) (string, bool) {
		internal, top := exists[path.Join("internal", name)], exists[name]
		switch {
		case internal && top:
			return "", false
		case internal:
			return path.Join("internal", name), true
		case top:
			return name, true
		}
		return "", false
	}
	rows := readTable(t)
	if len(rows) < 40 {
		t.Fatalf("%s's package table has %d rows: the check proves nothing", page, len(rows))
	}
	allowed := map[string]map[string]bool{}
	for _, r := range rows {
		p, ok := resolve(r.name)
		if !ok || !strings.HasPrefix(p, "internal/") {
			t.Errorf("%s:%d: the table names %q, which is no internal package", page, r.line, r.name)
			continue
		}
		if allowed[p] != nil {
			t.Errorf("%s:%d: %q has a second row", page, r.line, r.name)
		}
		allowed[p] = map[string]bool{}
		for _, a := range r.allow {
			ap, ok := resolve(a)
			if !ok {
				t.Errorf("%s:%d: %q may import %q, which is no agent-vm package (or names two)", page, r.line, r.name, a)
				continue
			}
			allowed[p][ap] = true
		}
	}
	checked := 0
	for _, p := range pkgs {
		rel := strings.TrimPrefix(p.ImportPath, mod+"/")
		if !strings.HasPrefix(rel, "internal/") {
			continue
		}
		allow, ok := allowed[rel]
		if !ok {
			t.Errorf("%s has no row in %s's package table (hint: add one: what it is for, which agent-vm packages it may import)", rel, page)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, mod+"/") {
				continue
			}
			checked++
			if ir := strings.TrimPrefix(imp, mod+"/"); !allow[ir] {
				t.Errorf("%s imports %s, which its row in %s does not allow (hint: keep data flowing one way; if the import is right, say so in the table)", rel, ir, page)
			}
		}
	}
	if checked < 100 {
		t.Fatalf("checked %d imports: the check proves nothing", checked)
	}
}

// modulePath is the module's path: what every internal package's import
// path has before /internal/.
func modulePath(pkgs []tu.Package) string {
	for _, p := range pkgs {
		if i := strings.Index(p.ImportPath, "/internal/"); i >= 0 {
			return p.ImportPath[:i]
		}
	}
	return ""
}
