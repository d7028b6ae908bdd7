package sockdir

import (
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
)

// umaskMu keeps Listen's umask changes from overlapping each other.
var umaskMu sync.Mutex

// Listen listens on the unix socket path, made with mode (0600: its owner
// alone may connect) from its first moment: the process's umask is
// tightened around the bind, where a chmod after it would leave the
// socket open to others for a moment. The umask is the process's, so a
// file another goroutine makes meanwhile gets no wider a mode than mode
// (only ever narrower than it asked for).
func Listen(path string, mode os.FileMode) (*net.UnixListener, error) {
	umaskMu.Lock()
	old := syscall.Umask(int(^mode.Perm() & 0o777))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	umaskMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	return ln, nil
}
