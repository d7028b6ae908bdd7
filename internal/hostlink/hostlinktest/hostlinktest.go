// Package hostlinktest gives tests agent-vm's link (internal/hostlink) to
// this machine's sshd stand-in (internal/sshx/sshdtest), the way a remote
// libvirt host is reached: the same machine, through the remote path.
package hostlinktest

import (
	"context"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
)

// Dial starts a real sshd (it needs root; the test skips otherwise) and
// returns it with a link to it, closed when the test ends.
func Dial(t testing.TB) (*sshdtest.Server, *ssh.Client) {
	t.Helper()
	srv := sshdtest.New(t)
	srv.Start()
	c, err := hostlink.Dial(context.Background(), hostlink.Target{Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}
