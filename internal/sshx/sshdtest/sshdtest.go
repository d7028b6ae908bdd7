// Package sshdtest runs a real OpenSSH server on 127.0.0.1 for tests: its
// own host key, one authorized client key, the current user. It is no fake:
// tests that need a guest's sshd get the real program (it needs root, for
// privilege separation, and skips otherwise).
package sshdtest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// Server is one sshd, not started until Start.
type Server struct {
	Port       int
	Addr       string // "127.0.0.1:PORT"
	User       string
	KeyFile    string // the authorized client's private key
	KnownHosts string // pins HostKey for Addr
	HostKey    sshkeys.Pair
	// AcceptEnv is passed on as sshd's AcceptEnv (set before Start).
	AcceptEnv string

	t    testing.TB
	dir  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	logs bytes.Buffer
}

// New prepares a server on a free port; the test skips without sshd or
// root.
func New(t testing.TB) *Server {
	t.Helper()
	bin := "/usr/sbin/sshd"
	_, err := os.Stat(bin)
	tu.Need(t, err == nil, "sshd is not installed (Debian package openssh-server)")
	tu.Need(t, os.Geteuid() == 0, "the test sshd needs root (privilege separation)")
	os.MkdirAll("/run/sshd", 0o755)
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	host, _ := sshkeys.Generate("test host")
	host.Write(filepath.Join(dir, "host"))
	client, _ := sshkeys.Generate("test client")
	client.Write(filepath.Join(dir, "client"))
	os.WriteFile(filepath.Join(dir, "authorized_keys"), client.AuthorizedKey, 0o600)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	os.WriteFile(filepath.Join(dir, "known_hosts"), []byte(sshkeys.KnownHostsLine(port, host.Public)), 0o600)
	u, _ := user.Current()
	return &Server{Port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port), User: u.Username,
		KeyFile: filepath.Join(dir, "client"), KnownHosts: filepath.Join(dir, "known_hosts"), HostKey: host, t: t, dir: dir}
}

// Start runs sshd in its own process group; the test's cleanup stops it
// (and prints its log when the test failed).
func (s *Server) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := []string{"-D", "-e", "-f", "/dev/null", "-p", fmt.Sprint(s.Port),
		"-o", "ListenAddress=127.0.0.1", "-o", "HostKey=" + filepath.Join(s.dir, "host"),
		"-o", "AuthorizedKeysFile=" + filepath.Join(s.dir, "authorized_keys"), "-o", "PidFile=none",
		"-o", "UsePAM=no", "-o", "StrictModes=no", "-o", "PermitRootLogin=prohibit-password",
		"-o", "PasswordAuthentication=no"}
	if s.AcceptEnv != "" {
		args = append(args, "-o", "AcceptEnv="+s.AcceptEnv)
	}
	cmd := exec.Command("/usr/sbin/sshd", args...)
	cmd.Stderr = &s.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = cmd
	s.t.Cleanup(func() {
		s.Stop()
		if s.t.Failed() {
			s.t.Logf("sshd log:\n%s", s.logs.String())
		}
	})
}

// Stop kills the server's process group: the listener and the processes
// that carry its open connections (not the users' sessions, which sshd
// puts in their own sessions), so every connection to it drops at once, as
// when a VM's QEMU goes away.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}
