package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// cacheAt is an image cache at dir, a top directory of its own.
func cacheAt(dir string) *hostdir.Dir { return hostdir.Top(dir, 0o755, hostdir.InXDG) }

// run runs a program for test setup and fails the test if it fails.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: name, Args: args})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return string(res.Stdout)
}

// makeQcow2 creates a real qcow2 image of the given virtual size.
func makeQcow2(t testing.TB, dir, name string, size int64) string {
	t.Helper()
	p := filepath.Join(dir, name)
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", p, fmt.Sprint(size))
	return p
}

// writeFile writes a file of size bytes holding the given (offset, bytes)
// patches over zeros.
func writeFile(t testing.TB, path string, size int, patches map[int]string) string {
	t.Helper()
	b := make([]byte, size)
	for off, s := range patches {
		copy(b[off:], s)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func wantErr(t testing.TB, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not contain %q", err, p)
		}
	}
}
