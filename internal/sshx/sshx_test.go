package sshx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/sshkeys"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// sshd is a real OpenSSH server on 127.0.0.1 for the test, with its own
// host key and one authorized key.
type sshd struct {
	port    int
	target  Target
	hostKey sshkeys.Pair
	start   func()
}

func newSSHD(t *testing.T) *sshd {
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
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	os.WriteFile(filepath.Join(dir, "known_hosts"), []byte(sshkeys.KnownHostsLine(port, host.Public)), 0o600)
	u, _ := user.Current()
	s := &sshd{port: port, hostKey: host, target: Target{Addr: fmt.Sprintf("127.0.0.1:%d", port), User: u.Username,
		KeyFile: filepath.Join(dir, "client"), KnownHosts: filepath.Join(dir, "known_hosts")}}
	s.start = func() {
		cmd := exec.Command(bin, "-D", "-e", "-f", "/dev/null", "-p", fmt.Sprint(port),
			"-o", "ListenAddress=127.0.0.1", "-o", "HostKey="+filepath.Join(dir, "host"),
			"-o", "AuthorizedKeysFile="+filepath.Join(dir, "authorized_keys"), "-o", "PidFile=none",
			"-o", "UsePAM=no", "-o", "StrictModes=no", "-o", "PermitRootLogin=prohibit-password",
			"-o", "PasswordAuthentication=no")
		var logs bytes.Buffer
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			if t.Failed() {
				t.Logf("sshd log:\n%s", logs.String())
			}
		})
	}
	return s
}

func TestWaitReadyWaitsForALateServer(t *testing.T) {
	s := newSSHD(t)
	time.AfterFunc(1500*time.Millisecond, s.start)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	attempts := 0
	c, err := WaitReady(ctx, s.target, func(time.Duration, error) { attempts++ })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if attempts == 0 {
		t.Error("connected before the server started?")
	}
	var out, errOut bytes.Buffer
	code, err := Run(ctx, c, "echo out; echo err >&2; exit 7", nil, &out, &errOut)
	if err != nil || code != 7 || out.String() != "out\n" || errOut.String() != "err\n" {
		t.Errorf("run: code %d err %v stdout %q stderr %q", code, err, out.String(), errOut.String())
	}
	code, err = Run(ctx, c, Quote([]string{"printf", "%s|", "a b", "it's", "$(x)"}), nil, &out, &errOut)
	if err != nil || code != 0 || !strings.HasSuffix(out.String(), "a b|it's|$(x)|") {
		t.Errorf("quoted argv: %q, %v", out.String(), err)
	}
	code, _ = Run(ctx, c, "cat", strings.NewReader("piped"), &out, &errOut)
	if code != 0 || !strings.HasSuffix(out.String(), "piped") {
		t.Errorf("stdin not passed: %q", out.String())
	}
}

func TestHostKeyMismatchIsRefusedAtOnce(t *testing.T) {
	s := newSSHD(t)
	s.start()
	other, _ := sshkeys.Generate("impostor")
	os.WriteFile(s.target.KnownHosts, []byte(sshkeys.KnownHostsLine(s.port, other.Public)), 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := WaitReady(ctx, s.target, nil)
	if !errors.Is(err, ErrHostKeyMismatch) {
		t.Fatalf("got %v, want ErrHostKeyMismatch", err)
	}
	if ctx.Err() != nil {
		t.Errorf("a mismatch must not be retried until the deadline (took %s)", time.Since(start))
	}
}

func TestWaitReadyGivesUpWithTheLastReason(t *testing.T) {
	s := newSSHD(t) // never started
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := WaitReady(ctx, s.target, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("got %v", err)
	}
}
