package state

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestRegistry(t *testing.T) {
	g := &Registry{Dir: top(filepath.Join(t.TempDir(), "state-dirs"))}
	if roots, err := g.Roots(); err != nil || len(roots) != 0 {
		t.Fatalf("a registry never written: %q, %v; want none", roots, err)
	}
	a, b := t.TempDir(), t.TempDir()
	for _, r := range []string{a, b, a} {
		if err := g.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	// Files this code did not write are left alone and not read as roots.
	os.WriteFile(filepath.Join(g.Dir.Path, "notes"), []byte("/etc\n"), 0o600)
	roots, err := g.Roots()
	slices.Sort(roots)
	want := []string{a, b}
	slices.Sort(want)
	if err != nil || !slices.Equal(roots, want) {
		t.Fatalf("roots %q, %v; want %q", roots, err, want)
	}
	if err := os.RemoveAll(b); err != nil {
		t.Fatal(err)
	}
	if roots, err := g.Roots(); err != nil || !slices.Equal(roots, []string{a}) {
		t.Errorf("after removing %s: roots %q, %v; want only %s", b, roots, err, a)
	}
	if _, err := os.Stat(filepath.Join(g.Dir.Path, registryName(b))); !os.IsNotExist(err) {
		t.Errorf("the entry of the removed directory is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(g.Dir.Path, "notes")); err != nil {
		t.Errorf("a file the registry did not write was removed: %v", err)
	}
	fi, err := os.Stat(g.Dir.Path)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("registry directory mode %v, %v; want 0700", fi.Mode().Perm(), err)
	}
}
