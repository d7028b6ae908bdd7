package testutil

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// skipReason is how a test documents a skip that is not the host's lack
// (the test does not apply here: another CPU, another build): a comment
// on the line above the Skip call that starts with it and goes on to say
// why.
const skipReason = "Skip, not SkipOrFail:"

// Every test skip in the repository's Go test code goes through the
// skip-or-fail rule (Need, Program, SkipOrFail), so that under
// AGENT_VM_TEST_STRICT=1 a missing program or capability fails rather
// than hides. A bare t.Skip, t.Skipf or t.SkipNow is allowed only under
// `if testing.Short()`, or with a comment on the line above that starts
// "Skip, not SkipOrFail:" and says why the rule does not apply.
func TestSkipsGoThroughTheRule(t *testing.T) {
	root := repoRoot(t)
	var bad []string
	shorts := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		s := bareSkips(fset, f)
		shorts += s.short
		for _, line := range s.bare {
			bad = append(bad, rel+":"+line)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if shorts < 5 {
		t.Fatalf("found only %d skips under testing.Short(): the scanner is broken", shorts)
	}
	for _, b := range bad {
		t.Errorf(`%s: a bare Skip; use testutil.Need or SkipOrFail (blackbox's outside internal/), or say why not in a comment above it starting %q`, b, skipReason)
	}
}

// The scanner itself, on sources that break the rule and sources that
// keep it.
func TestBareSkipsFindsThem(t *testing.T) {
	for _, c := range []struct {
		name, body string
		bare       int
	}{
		{"a bare skip", `if os.Geteuid() != 0 { t.Skip("needs root") }`, 1},
		{"Skipf and SkipNow", `if x { b.Skipf("no %s", y) }; tb.SkipNow()`, 2},
		{"under testing.Short()", `if testing.Short() { t.Skip("slow") }`, 0},
		{"in the else of testing.Short()", `if testing.Short() { return } else { t.Skip("no") }`, 1},
		{"documented", "if x {\n// " + skipReason + " another CPU.\nt.Skip(\"no\") }", 0},
		{"documented without a reason", "if x {\n// " + skipReason + "\nt.Skip(\"no\") }", 1},
		{"a comment two lines up", "// " + skipReason + " another CPU.\n\nt.Skip(\"no\")", 1},
		{"the rule", `Need(t, ok, "why"); SkipOrFail(t, "why")`, 0},
	} {
		src := "package p\nfunc f() {\n" + c.body + "\n}\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "p_test.go", src, parser.ParseComments)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := bareSkips(fset, f).bare; len(got) != c.bare {
			t.Errorf("%s: found bare skips at %q, want %d", c.name, got, c.bare)
		}
	}
}

// skips are the Skip calls of a file: the bare ones (their lines), and
// how many are under testing.Short().
type skips struct {
	bare  []string
	short int
}

// bareSkips finds f's calls of Skip, Skipf and SkipNow that are neither
// in the body of an `if` whose condition calls testing.Short() nor
// documented by a comment ending on the line above (skipReason).
func bareSkips(fset *token.FileSet, f *ast.File) skips {
	documented := map[int]bool{} // the line below such a comment
	for _, g := range f.Comments {
		text := strings.TrimSpace(g.Text())
		if rest, ok := strings.CutPrefix(text, skipReason); ok && strings.TrimSpace(rest) != "" {
			documented[fset.Position(g.End()).Line+1] = true
		}
	}
	var out skips
	var stack []ast.Node
	ast.Inspect(f, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		stack = append(stack, n)
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "Skip" && sel.Sel.Name != "Skipf" && sel.Sel.Name != "SkipNow") {
			return true
		}
		line := fset.Position(call.Pos()).Line
		switch {
		case underShort(stack):
			out.short++
		case !documented[line]:
			out.bare = append(out.bare, strconv.Itoa(line))
		}
		return true
	})
	return out
}

// underShort reports whether the innermost node of stack lies in the body
// (not the else) of an `if` whose condition calls testing.Short().
func underShort(stack []ast.Node) bool {
	for i := len(stack) - 2; i >= 0; i-- {
		ifs, ok := stack[i].(*ast.IfStmt)
		if !ok || stack[i+1] != ast.Node(ifs.Body) {
			continue
		}
		short := false
		ast.Inspect(ifs.Cond, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "Short" {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "testing" {
					short = true
				}
			}
			return true
		})
		if short {
			return true
		}
	}
	return false
}
