package testutil

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// UpdateGoldenEnv names the one switch that rewrites golden files:
// `AGENT_VM_UPDATE_GOLDEN=1 go test ./...`, then review the diff. It is an
// environment variable rather than a -update flag so that the same command
// works across every package (go test would reject a flag in the packages
// that do not define it).
const UpdateGoldenEnv = "AGENT_VM_UPDATE_GOLDEN"

// Golden compares got with the golden file at path (relative to the test's
// package, e.g. testdata/x.golden), reporting where they first differ. With
// AGENT_VM_UPDATE_GOLDEN=1 it writes got to path instead, making its
// directory if need be.
func Golden(t testing.TB, path string, got []byte) {
	t.Helper()
	if os.Getenv(UpdateGoldenEnv) == "1" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (to create it: %s)", err, regenerate(t))
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the output differs from the golden file %s (review, then %s), first at %s", path, regenerate(t), firstDiff(got, want))
	}
}

// regenerate is the command that rewrites the goldens of the running test.
func regenerate(t testing.TB) string {
	test, _, _ := strings.Cut(t.Name(), "/")
	return UpdateGoldenEnv + "=1 go test " + packageDir() + " -run '^" + test + "$'"
}

// packageDir is the test's package as go test names it (./internal/qemu),
// found by looking for go.mod above the working directory; "." if none.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			rel, err := filepath.Rel(dir, wd)
			if err != nil || rel == "." {
				return "."
			}
			return "./" + filepath.ToSlash(rel)
		}
		if filepath.Dir(dir) == dir {
			return "."
		}
	}
}

// firstDiff shows where got first departs from want, with some context
// around it on both sides.
func firstDiff(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	line := bytes.Count(got[:i], []byte("\n")) + 1
	window := func(b []byte) string {
		lo, hi := max(0, i-60), min(len(b), i+60)
		return strconv.Quote(string(b[lo:hi]))
	}
	return "line " + strconv.Itoa(line) + ", byte " + strconv.Itoa(i) + ":\n got  " + window(got) + "\n want " + window(want)
}
