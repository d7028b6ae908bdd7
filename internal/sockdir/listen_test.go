package sockdir

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Listen makes the socket with the mode asked for, whatever the umask,
// and leaves the umask as it was.
func TestListenMakesTheSocketWithItsMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	for _, mode := range []os.FileMode{0o600, 0o660} {
		sock := filepath.Join(t.TempDir(), "s.sock")
		ln, err := Listen(sock, mode)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(sock)
		if err != nil || fi.Mode().Perm() != mode || fi.Mode()&os.ModeSocket == 0 {
			t.Errorf("socket %v, %v; want a socket of mode %04o", fi.Mode(), err, mode)
		}
		ln.Close()
	}
	if now := syscall.Umask(0); now != 0 {
		t.Errorf("umask %04o after Listen, want it as it was (0)", now)
	}
	if _, err := Listen(filepath.Join(t.TempDir(), "no", "such", "dir.sock"), 0o600); err == nil {
		t.Error("Listen in a missing directory: no error")
	}
}
