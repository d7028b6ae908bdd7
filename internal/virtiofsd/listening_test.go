package virtiofsd

import (
	"net"
	"path/filepath"
	"syscall"
	"testing"
)

// A socket is listening once listen(2) ran, not at bind(2), when its file
// appears: what Start waits for before QEMU connects. Paths with a space
// are read whole.
func TestListening(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a dir")
	if err := syscall.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	bound := filepath.Join(dir, "bound.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: bound}); err != nil {
		t.Fatal(err)
	}
	if Listening(bound) {
		t.Errorf("a socket that is bound, not listening, reads as listening")
	}
	if err := syscall.Listen(fd, 1); err != nil {
		t.Fatal(err)
	}
	if !Listening(bound) {
		t.Errorf("a listening socket at %q reads as not listening", bound)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "go.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !Listening(filepath.Join(dir, "go.sock")) || Listening(filepath.Join(dir, "none.sock")) {
		t.Errorf("Listening: go.sock %v (want true), none.sock %v (want false)", Listening(filepath.Join(dir, "go.sock")), Listening(filepath.Join(dir, "none.sock")))
	}
}
