package wsfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestRead(t *testing.T) {
	ws := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("host secret"), 0o600)
	os.MkdirAll(filepath.Join(ws, ".agent-vm"), 0o755)
	os.WriteFile(filepath.Join(ws, ".agent-vm", "config.toml"), []byte("cpus = 2\n"), 0o644)
	os.Symlink(outside, filepath.Join(ws, "link"))
	os.Symlink(filepath.Dir(outside), filepath.Join(ws, "linkdir"))
	syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o644)
	os.WriteFile(filepath.Join(ws, "big"), make([]byte, 100), 0o644)

	if b, err := Read(ws, ".agent-vm/config.toml", 1<<20); err != nil || string(b) != "cpus = 2\n" {
		t.Errorf("config: %q, %v", b, err)
	}
	for _, rel := range []string{"link", "linkdir/secret", "fifo", ".agent-vm"} {
		b, err := Read(ws, rel, 1<<20)
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("%s: got %q, %v; want ErrNotRegular", rel, b, err)
		}
	}
	if _, err := Read(ws, "missing/x", 10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	if _, err := Read(ws, "big", 10); err == nil || !strings.Contains(err.Error(), "larger") {
		t.Errorf("big: %v", err)
	}
	if _, err := Read(ws, "../x", 10); err == nil {
		t.Error("../x read")
	}
}
