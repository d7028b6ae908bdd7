package archtest

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// maxLines is how many non-test lines (what `go list` calls GoFiles,
// counted as wc -l counts) a package may have: past it, it holds two
// concepts, and the one that grew gets a package of its own.
const maxLines = 4000

// over are the packages still past their room's size, each held where it
// is now so it can only shrink: lower a limit when a package shrinks, and
// remove its line once it is within maxLines.
var over = map[string]int{}

// vmLines is vm's own limit, lower than every other room's: vm is the VM's
// life and nothing else, and a feature that would push it past this finds
// a room of its own. Its goal is 3,000. Lower it as it shrinks.
const vmLines = 3126

// TestRoomsStaySmall fails when a package outgrows its room.
func TestRoomsStaySmall(t *testing.T) {
	pkgs := tu.Packages(t)
	mod := modulePath(pkgs)
	counted := map[string]int{}
	for _, p := range pkgs {
		n := 0
		for _, f := range p.GoFiles {
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			n += bytes.Count(b, []byte("\n"))
		}
		rel := strings.TrimPrefix(p.ImportPath, mod+"/")
		counted[rel] = n
		limit, held := over[rel]
		switch {
		case rel == "internal/vm":
			limit = vmLines
		case !held:
			limit = maxLines
		}
		if n > limit {
			t.Errorf("%s has %d non-test lines, over its limit of %d (hint: find the concept that grew in it and give it a package of its own; docs/ARCHITECTURE.md lists the rooms)", rel, n, limit)
		}
		if held && n <= maxLines {
			t.Errorf("%s has %d non-test lines, within %d: remove its line from over", rel, n, maxLines)
		}
	}
	for _, rel := range append(slices.Collect(maps.Keys(over)), "internal/vm") {
		if counted[rel] < 1000 {
			t.Errorf("%s was not counted, or has %d lines: the check proves nothing for it", rel, counted[rel])
		}
	}
}
