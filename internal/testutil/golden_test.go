package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// reporter is a testing.TB that records failures instead of failing the
// test; like testing's, its Fatalf ends the goroutine (see call).
type reporter struct {
	testing.TB
	errors []string
}

func (r *reporter) Helper() {}
func (r *reporter) Errorf(f string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(f, args...))
}
func (r *reporter) Fatalf(f string, args ...any) {
	r.Errorf(f, args...)
	runtime.Goexit()
}

// golden runs Golden with a reporter and returns what it reported.
func golden(t *testing.T, path string, got []byte) []string {
	r := &reporter{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Golden(r, path, got)
	}()
	<-done
	return r.errors
}

func TestGolden(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "testdata", "x.golden")

	t.Setenv(UpdateGoldenEnv, "")
	errs := golden(t, path, []byte("one\n"))
	if len(errs) != 1 || !strings.Contains(errs[0], "AGENT_VM_UPDATE_GOLDEN=1 go test ./internal/testutil -run '^TestGolden$'") {
		t.Errorf("a missing golden file: got %q, want one error naming the command that creates it", errs)
	}

	t.Setenv(UpdateGoldenEnv, "1")
	if errs := golden(t, path, []byte("one\ntwo\n")); len(errs) != 0 {
		t.Fatalf("updating: %q", errs)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "one\ntwo\n" {
		t.Fatalf("the update wrote %q (%v), want the new content", b, err)
	}

	t.Setenv(UpdateGoldenEnv, "")
	if errs := golden(t, path, []byte("one\ntwo\n")); len(errs) != 0 {
		t.Errorf("the same content: got %q, want no error", errs)
	}
	errs = golden(t, path, []byte("one\nthree\n"))
	if len(errs) != 1 || !strings.Contains(errs[0], "line 2, byte 5") || !strings.Contains(errs[0], "golden file "+path) {
		t.Errorf("changed content: got %q, want one error saying where it differs", errs)
	}
	if b, _ := os.ReadFile(path); string(b) != "one\ntwo\n" {
		t.Errorf("a failed comparison changed the golden file to %q", b)
	}
}
