// Package sshdtest runs a real OpenSSH server on 127.0.0.1 for tests: its
// own host key, one authorized client key, the current user. It is no fake:
// tests that need a guest's sshd get the real program (it needs root, for
// privilege separation, and skips otherwise).
package sshdtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// Server is one sshd, not started until Start.
type Server struct {
	Port int
	Addr string // "127.0.0.1:PORT"
	User string // the current user's name; any user with a shell may be set

	KeyFile    string // the authorized client's private key
	KnownHosts string // pins HostKey for Addr
	HostKey    sshkeys.Pair
	// AcceptEnv is passed on as sshd's AcceptEnv (set before Start).
	AcceptEnv string
	// SetEnv is passed on as sshd's SetEnv (set before Start): each
	// session's environment, PATH included.
	SetEnv string

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

// usePAM is "yes" for a user other than the current one, whose account
// may be locked for passwords ("!"): sshd without PAM takes that as locked
// for keys too.
func usePAM(name string) string {
	if u, err := user.Current(); err == nil && u.Username != name {
		return "yes"
	}
	return "no"
}

// OtherUser returns a user other than root with a login shell, to log in
// as when the test runs as root: OpenSSH handles a root login's session
// requests without privilege separation and so refuses "signal" requests,
// which it honours for other users (as for a guest's). On a host that has
// none (a fresh CI machine), a root test makes one for itself (useradd,
// no home) and removes it at its end; otherwise the test skips.
func OtherUser(t testing.TB) string {
	t.Helper()
	passwd, _ := os.ReadFile("/etc/passwd")
	shells, _ := os.ReadFile("/etc/shells")
	for _, line := range strings.Split(string(passwd), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 7 || f[2] == "0" || f[6] == "" || strings.HasSuffix(f[6], "nologin") || strings.HasSuffix(f[6], "false") {
			continue
		}
		if slices.Contains(strings.Fields(string(shells)), f[6]) {
			return f[0]
		}
	}
	tu.Need(t, os.Geteuid() == 0, "no user other than root with a login shell to log in as")
	tu.Program(t, "useradd")
	tu.Program(t, "userdel")
	name := fmt.Sprintf("agentvm-t%d", os.Getpid())
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v\n%s", name, err, out)
		}
	})
	return name
}

// Authorize adds a public key (an authorized_keys line) for the server's
// user; sshd reads the file at each login. Call it before Start for
// another user than the current one (Start copies the file for them).
func (s *Server) Authorize(line []byte) {
	s.t.Helper()
	f, err := os.OpenFile(filepath.Join(s.dir, "authorized_keys"), os.O_WRONLY|os.O_APPEND, 0o600)
	if err == nil {
		_, err = f.Write(append(bytes.TrimSpace(line), '\n'))
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		s.t.Fatal(err)
	}
}

// Start runs sshd in its own process group and waits (up to 10 s) until it
// listens; the test's cleanup stops it
// (and prints its log when the test failed).
func (s *Server) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := filepath.Join(s.dir, "authorized_keys")
	if usePAM(s.User) == "yes" {
		// sshd reads the file as the user, who cannot reach s.dir.
		keys = s.readableKeys()
	}
	args := []string{"-D", "-e", "-f", "/dev/null", "-p", fmt.Sprint(s.Port),
		"-o", "ListenAddress=127.0.0.1", "-o", "HostKey=" + filepath.Join(s.dir, "host"),
		"-o", "AuthorizedKeysFile=" + keys, "-o", "PidFile=none",
		"-o", "UsePAM=" + usePAM(s.User), "-o", "StrictModes=no", "-o", "PermitRootLogin=prohibit-password",
		"-o", "PasswordAuthentication=no"}
	if s.AcceptEnv != "" {
		args = append(args, "-o", "AcceptEnv="+s.AcceptEnv)
	}
	if s.SetEnv != "" {
		args = append(args, "-o", "SetEnv="+s.SetEnv)
	}
	cmd := exec.Command("/usr/sbin/sshd", args...)
	if rc := s.bashrc(); rc != "" {
		// bash reads the login user's ~/.bashrc before every command
		// sshd runs (Debian's bash does when started by sshd), and a
		// machine's own (this CI machine's root runs `pyenv init`: about
		// 2 s) would be paid by each of a test's commands: in a mount
		// namespace of sshd's own, an empty file covers it, as a new
		// host's root has none.
		cmd = exec.Command(tu.Program(s.t, "unshare"), append([]string{"--mount", "--propagation", "private", "--",
			"/bin/sh", "-c", `mount --bind /dev/null "$0" && exec "$@"`, rc, "/usr/sbin/sshd"}, args...)...)
	}
	cmd.Stderr = &s.logs
	cmd.WaitDelay = 5 * time.Second // a session's process may keep sshd's stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = cmd
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", s.Addr); err == nil {
			c.Close()
			break
		}
	}
	s.t.Cleanup(func() {
		s.Stop()
		if s.t.Failed() {
			s.t.Logf("sshd log:\n%s", s.logs.String())
		}
	})
}

// bashrc is the login user's ~/.bashrc when there is one, else "".
func (s *Server) bashrc() string {
	u, err := user.Lookup(s.User)
	if err != nil || u.HomeDir == "" {
		return ""
	}
	rc := filepath.Join(u.HomeDir, ".bashrc")
	if fi, err := os.Stat(rc); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return rc
}

// readableKeys copies the authorized key (a public key) where any user
// can read it.
func (s *Server) readableKeys() string {
	dir, err := os.MkdirTemp("", "sshdtest-")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	b, _ := os.ReadFile(filepath.Join(s.dir, "authorized_keys"))
	keys := filepath.Join(dir, "authorized_keys")
	os.WriteFile(keys, b, 0o644)
	return keys
}

// Stop kills the server and every process it started: the listener and
// the processes that carry its open connections (each in a session of its
// own), so every connection to it drops at once, as when a VM's QEMU goes
// away.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	pid := s.cmd.Process.Pid
	syscall.Kill(pid, syscall.SIGSTOP) // no new connections while the tree is read
	for _, p := range descendants(pid) {
		syscall.Kill(p, syscall.SIGKILL)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}

// Freeze stops (true) or continues (false) the server and every process
// it started: its connections stay open and answer nothing, as a paused
// VM's guest.
func (s *Server) Freeze(frozen bool) {
	sig := syscall.SIGCONT
	if frozen {
		sig = syscall.SIGSTOP
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	pid := s.cmd.Process.Pid
	for _, p := range append([]int{pid}, descendants(pid)...) {
		syscall.Kill(p, sig)
	}
}

// descendants lists the processes below pid, read from /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	des, _ := os.ReadDir("/proc")
	for _, de := range des {
		p, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + de.Name() + "/stat")
		i := strings.LastIndexByte(string(stat), ')')
		if err != nil || i < 0 {
			continue
		}
		if f := strings.Fields(string(stat[i+1:])); len(f) > 1 {
			ppid, _ := strconv.Atoi(f[1])
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}
