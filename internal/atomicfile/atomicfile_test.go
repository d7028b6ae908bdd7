package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReplacesAndLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	for _, content := range []string{"old", "new content"} {
		if err := Write(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Fatalf("read %q (%v), want %q", got, err, content)
		}
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if des, _ := os.ReadDir(dir); len(des) != 1 {
		t.Errorf("the directory holds %v, want only f.json", des)
	}
}

// A writer that fails half way leaves the old file whole and no debris.
func TestWriteFromFailureKeepsTheOldFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "seed.iso")
	if err := Write(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := WriteFrom(p, 0o644, func(w io.Writer) error {
		w.Write([]byte("half"))
		return errors.New("disk full")
	})
	if err == nil {
		t.Fatal("a failed write reported success")
	}
	if got, _ := os.ReadFile(p); string(got) != "old" {
		t.Errorf("after a failed write the file holds %q, want the old content", got)
	}
	if des, _ := os.ReadDir(dir); len(des) != 1 {
		t.Errorf("the failed write left %v", des)
	}
}

// SyncFS writes out the filesystem of a path that is there, and names a
// path that is not.
func TestSyncFS(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SyncFS(dir); err != nil {
		t.Errorf("SyncFS of %s: %v", dir, err)
	}
	missing := filepath.Join(dir, "missing")
	if err := SyncFS(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("SyncFS of a missing path: %v, want an error naming it", err)
	}
}
