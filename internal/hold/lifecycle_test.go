package hold

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sshx"
)

// The lifecycle tests run the holder as its own process, as agent-vm
// does: this test binary, re-run with holderEnv set, is that process
// (TestMain), with the run directory as the argument that marks it.
const holderEnv = "AGENT_VM_HOLD_TEST_HOLDER"

func TestMain(m *testing.M) {
	if cfg := os.Getenv(holderEnv); cfg != "" {
		os.Exit(holderMain(cfg, os.Args[len(os.Args)-1]))
	}
	os.Exit(m.Run())
}

// holderMain is the holder process: cfg is "addr user key known_hosts".
func holderMain(cfg, runDir string) int {
	f := strings.Fields(cfg)
	target := sshx.Target{Addr: f[0], User: f[1], KeyFile: f[2], KnownHosts: f[3]}
	log := hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Debug})
	h := &Holder{Files: FilesFor(runDir, testUUID), RunDir: runDir, Log: log, Keepalive: time.Second,
		Dial: func(ctx context.Context) (*ssh.Client, error) { return sshx.Dial(ctx, target, 10*time.Second) }}
	ctx, stop := signalContext()
	defer stop()
	if err := h.Run(ctx); err != nil {
		log.Error("holder failed", "error", err)
		return 1
	}
	return 0
}

// holderProcess starts the holder process for the guest sshd s and waits
// until it serves; it writes the pid file as vm does.
func holderProcess(t *testing.T, target sshx.Target) (Files, string, *exec.Cmd, <-chan struct{}) {
	t.Helper()
	runDir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$", runDir)
	cmd.Env = append(os.Environ(), holderEnv+"="+strings.Join([]string{target.Addr, target.User, target.KeyFile, target.KnownHosts}, " "))
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill() })
	f := FilesFor(runDir, testUUID)
	os.WriteFile(f.Pid, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
	waitServing(t, f, target.User, exited)
	return f, runDir, cmd, exited
}

func waitExit(t *testing.T, exited <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the holder still runs 30s after %s", what)
	}
}

func assertGone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s is left behind (%v)", p, err)
		}
	}
}

func TestHolderEndsWhenTheGuestGoes(t *testing.T) {
	s := guestSSHD(t)
	f, _, _, exited := holderProcess(t, targetOf(s))
	s.Stop() // every connection to the guest drops, as when QEMU exits
	waitExit(t, exited, "its guest went away")
	assertGone(t, f.Socket, f.Key, f.HostKey)
	if _, err := Dial(context.Background(), f, s.User, time.Second); err == nil {
		t.Error("a holder without a guest still answers")
	}
}

func TestStopEndsTheHolder(t *testing.T) {
	s := guestSSHD(t)
	f, runDir, cmd, exited := holderProcess(t, targetOf(s))
	if got := Pid(f, runDir); got != cmd.Process.Pid {
		t.Errorf("Pid: got %d, want %d", got, cmd.Process.Pid)
	}
	if got := Pid(f, "/another/vm/run"); got != 0 {
		t.Errorf("Pid of another VM's marker: got %d, want 0 (a recycled pid must not match)", got)
	}
	if err := Stop(context.Background(), f, runDir, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitExit(t, exited, "Stop")
	if cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("the holder's exit code on SIGTERM: %d, want 0", cmd.ProcessState.ExitCode())
	}
	assertGone(t, f.Socket, f.Key, f.HostKey, f.Pid)
	if Pid(f, runDir) != 0 {
		t.Error("Pid still names a holder after Stop")
	}
}

func TestStaleSocketIsReplacedAndALiveOneKept(t *testing.T) {
	s := guestSSHD(t)
	runDir := t.TempDir()
	f := FilesFor(runDir, testUUID)
	// A holder that died left its socket.
	ln, err := net.Listen("unix", f.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := Dial(context.Background(), f, s.User, time.Second); err == nil {
		t.Fatal("a dead socket answered")
	}
	h := &Holder{Files: f, RunDir: runDir, Log: testLogger(t),
		Dial: func(ctx context.Context) (*ssh.Client, error) { return sshx.Dial(ctx, targetOf(s), 10*time.Second) }}
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() { h.Run(ctx); close(ended) }()
	defer func() { cancel(); <-ended }()
	waitServing(t, f, s.User, ended)

	// A second holder leaves the live one alone.
	err = (&Holder{Files: f, RunDir: runDir, Log: testLogger(t), Dial: h.Dial}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "another holder serves "+f.Socket) {
		t.Errorf("a second holder: got %v, want refused", err)
	}
	c := dialHolder(t, f, s)
	if out, err := sessionOutput(c, "echo still"); err != nil || out != "still\n" {
		t.Errorf("the first holder after the second's attempt: %q %v", out, err)
	}
}

func TestAFileInTheSocketsWayIsRefused(t *testing.T) {
	s := guestSSHD(t)
	runDir := t.TempDir()
	f := FilesFor(runDir, testUUID)
	os.WriteFile(f.Socket, []byte("not mine"), 0o600)
	h := &Holder{Files: f, RunDir: runDir, Log: testLogger(t),
		Dial: func(ctx context.Context) (*ssh.Client, error) { return sshx.Dial(ctx, targetOf(s), 10*time.Second) }}
	err := h.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), f.Socket) || !strings.Contains(err.Error(), "hint: remove it") {
		t.Errorf("got %v, want a refusal naming %s", err, f.Socket)
	}
	if b, _ := os.ReadFile(f.Socket); string(b) != "not mine" {
		t.Error("the file in the way was changed")
	}
}

func TestLongRunDirsPutTheSocketInTheSocketDir(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 90), "run")
	f := FilesFor(long, testUUID)
	if len(f.Socket) > 100 || filepath.Dir(f.Socket) == long {
		t.Errorf("socket %s (%d bytes) for run dir %s", f.Socket, len(f.Socket), long)
	}
	if filepath.Dir(f.Key) != long || filepath.Dir(f.Pid) != long {
		t.Errorf("the keys and pid belong in the run dir: %+v", f)
	}
	if short := FilesFor("/s/run", testUUID); short.Socket != "/s/run/"+SocketName {
		t.Errorf("a short run dir: %s", short.Socket)
	}
}

func sessionOutput(c *ssh.Client, cmd string) (string, error) {
	s, err := c.NewSession()
	if err != nil {
		return "", fmt.Errorf("session: %w", err)
	}
	defer s.Close()
	out, err := s.Output(cmd)
	return string(out), err
}
