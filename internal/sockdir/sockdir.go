// Package sockdir says where a VM's unix sockets live. A socket's path must
// fit the kernel's sun_path (108 bytes with the terminating NUL), and a
// state directory can be deeper than that: then a VM's sockets move from its
// run directory to a private directory of this user under
// $XDG_RUNTIME_DIR (or the temporary directory), named after the VM's UUID.
// QEMU's sockets (internal/qemu) and the held connection's (internal/hold)
// share it.
package sockdir

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// MaxPath keeps socket paths under the kernel's limit, with room to spare.
const MaxPath = 100

// MaxName is the longest socket name a socket directory must hold
// ("virtiofsd.sock"): every user of For keeps its names this short.
const MaxName = 14

// For returns where the sockets of the VM with this run directory and UUID
// live: its run directory when a MaxName-long name fits, else a private
// directory of this user named after the UUID. It only computes the path;
// Ensure creates it.
func For(runDir, uuid string) string {
	if len(runDir)+1+MaxName <= MaxPath {
		return runDir
	}
	return filepath.Join(base(), strings.ReplaceAll(uuid, "-", "")[:12])
}

func base() string {
	b := os.Getenv("XDG_RUNTIME_DIR")
	if b == "" {
		b = os.TempDir()
	}
	return filepath.Join(b, fmt.Sprintf("agent-vm-%d", os.Geteuid()))
}

// Ensure creates dir, the socket directory For named for runDir, mode
// 0700. Outside the run directory, the shared parent must be a directory
// of this user's that others cannot write to (in /tmp someone else could
// have made it first); it is made 0700, and set to 0700 when it is not.
func Ensure(dir, runDir string) error {
	if dir == runDir {
		return os.MkdirAll(dir, 0o700)
	}
	if len(dir)+1+MaxName > MaxPath {
		return fmt.Errorf("socket directory %s is too long for unix sockets (hint: set XDG_RUNTIME_DIR to a short path)", dir)
	}
	parent := hostdir.Top(filepath.Dir(dir), 0o700, hostdir.InXDG)
	parent.Shared = true
	if err := parent.Sub(filepath.Base(dir), 0o700).Make(); err != nil {
		return fmt.Errorf("creating the socket directory (XDG_RUNTIME_DIR chooses where): %w", err)
	}
	return nil
}
