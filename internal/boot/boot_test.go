package boot

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/sshx/sshdtest"
	"github.com/agent-vm/agent-vm/internal/state"
)

// processDriver is a FAKE driver standing at the driver contract for the
// wait's three questions: its machine is a real process (sleep, standing
// for QEMU) that Running watches, its logs are files, and it records each
// MarkReady it is asked for. Every other driver method is the nil
// interface's (a call would panic: the wait makes none).
type processDriver struct {
	driver.Driver
	proc   *exec.Cmd
	exited chan struct{}
	logs   driver.Logs
	mu     sync.Mutex
	ready  []time.Time
}

func newProcessDriver(t *testing.T) *processDriver {
	dir := t.TempDir()
	d := &processDriver{proc: exec.Command("sleep", "600"), exited: make(chan struct{}),
		logs: driver.Logs{Console: filepath.Join(dir, "console.log"), Driver: filepath.Join(dir, "qemu.log")}}
	if err := os.WriteFile(d.logs.Console, []byte("Booting Linux\n\x1b[1mReached target Network\x1b[0m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.logs.Driver, []byte("qemu-system-x86_64: terminating on signal 9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.proc.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = d.proc.Wait(); close(d.exited) }()
	t.Cleanup(func() { _ = d.proc.Process.Kill() })
	return d
}

func (d *processDriver) Running(driver.Machine, *driver.Launch) bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

func (d *processDriver) Logs(driver.Machine) driver.Logs { return d.logs }

func (d *processDriver) MarkReady(_ driver.Machine, at time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ready = append(d.ready, at)
	return nil
}

// closedPort is a 127.0.0.1 address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func machineOf(d *processDriver, target sshx.Target) Machine {
	return Machine{VM: "feature/x", Slug: "feature-x", Driver: d, Launch: &driver.Launch{}, Target: target, Log: hclog.NewNullLogger()}
}

func TestSSHAnswersAndTheMachineIsMarkedReady(t *testing.T) {
	s := sshdtest.New(t)
	s.Start()
	d := newProcessDriver(t)
	var phases []string
	m := machineOf(d, sshx.Target{Addr: s.Addr, User: s.User, KeyFile: s.KeyFile, KnownHosts: s.KnownHosts})
	m.Report = func(phase string, _ time.Duration, _ string) { phases = append(phases, phase) }
	w := m.Begin(context.Background(), time.Minute)
	defer w.Done()
	c, _, err := w.SSH("waiting for SSH")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if len(d.ready) != 1 {
		t.Errorf("MarkReady called %d times, want once", len(d.ready))
	}
}

func TestQEMUExitingEndsTheWaitWithItsLog(t *testing.T) {
	d := newProcessDriver(t)
	var lines []string
	m := machineOf(d, sshx.Target{Addr: closedPort(t), User: "agent", KeyFile: "/nonexistent", KnownHosts: "/nonexistent"})
	m.Report = func(_ string, _ time.Duration, last string) { lines = append(lines, last) }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // only a hung test ends here
	defer cancel()
	w := m.Begin(ctx, time.Hour) // the base is not what ends it
	defer w.Done()
	time.AfterFunc(time.Second, func() { _ = d.proc.Process.Kill() })
	_, _, err := w.SSH("waiting for SSH")
	var be *Error
	if !errors.As(err, &be) {
		t.Fatalf("want a boot.Error, got %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the wait ran to the test's own deadline: QEMU's exit did not end it")
	}
	msg := be.Error()
	for _, want := range []string{"booting", "QEMU exited during boot", "terminating on signal 9", "Reached target Network", "the VM is still running"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q:\n%s", want, msg)
		}
	}
	if len(d.ready) != 0 {
		t.Error("a machine that never answered was marked ready")
	}
	if len(lines) == 0 || strings.Contains(lines[len(lines)-1], "\x1b") {
		t.Errorf("progress should carry the console's last line, escapes removed: %q", lines)
	}
}

func TestTimeoutSaysItRanOut(t *testing.T) {
	d := newProcessDriver(t)
	m := machineOf(d, sshx.Target{Addr: closedPort(t), User: "agent", KeyFile: "/nonexistent", KnownHosts: "/nonexistent"})
	m.Timeout = 2 * time.Second
	w := m.Begin(context.Background(), time.Hour)
	defer w.Done()
	_, err := w.Health()
	var be *Error
	if !errors.As(err, &be) || be.Phase != "waiting for agent-mcp /health" {
		t.Fatalf("want a boot.Error waiting for agent-mcp, got %v", err)
	}
	if !strings.Contains(be.Error(), "--timeout 2s ran out") || !strings.Contains(be.Error(), "agent-vm logs feature-x") {
		t.Errorf("the error does not name what ran out and where to look:\n%s", be.Error())
	}
}

func TestTheCallersInterruptIsReturnedAsIs(t *testing.T) {
	d := newProcessDriver(t)
	m := machineOf(d, sshx.Target{Addr: closedPort(t), User: "agent", KeyFile: "/nonexistent", KnownHosts: "/nonexistent"})
	ctx, cancel := context.WithCancel(context.Background())
	w := m.Begin(ctx, time.Hour)
	defer w.Done()
	time.AfterFunc(500*time.Millisecond, cancel)
	if _, _, err := w.SSH("waiting for SSH"); !errors.Is(err, context.Canceled) {
		t.Errorf("an interrupted wait should return the caller's error, got %v", err)
	}
}

func TestAStoppedMachineSaysSo(t *testing.T) {
	e := &Error{VM: "x", Phase: "mounting the workspace", Err: errors.New("no"), Stopped: true}
	if msg := e.Error(); strings.Contains(msg, "still running") || !strings.Contains(msg, "the VM was stopped") {
		t.Errorf("a stopped VM's error says otherwise:\n%s", msg)
	}
}

func TestColdForTCGWaitsLonger(t *testing.T) {
	if ColdFor("tcg") <= ColdFor("kvm") {
		t.Errorf("TCG's base %s is not longer than KVM's %s", ColdFor("tcg"), ColdFor("kvm"))
	}
	if got := ToolTimeout(42*time.Second, Cold); got != 42*time.Second {
		t.Errorf("the user's --timeout is kept as it is: got %s", got)
	}
}

// As logs in with another VM's keys (a directory laid out as that VM's:
// the real sshd's authorized client key and its host key), runs the script
// as root and returns its output; the known_hosts file it pinned that host
// key in is gone after. A guest with another host key is refused at once
// with sshx.ErrHostKeyMismatch; so is a missing key, with its file named.
// The sshd is real; sudo, which the guest's root shell runs, is a FAKE
// (labelled) on the session's PATH that runs its command as the user the
// test logs in as, root (this host has no sudo).
func TestAsLogsInAsTheOtherVM(t *testing.T) {
	s := sshdtest.New(t)
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "sudo"), []byte("#!/bin/sh\n# FAKE sudo: drops -n, runs the rest\n[ \"$1\" = -n ] && shift\nexec \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.SetEnv = "PATH=" + bin + ":/usr/bin:/bin"
	s.Start()
	other := state.Layout{Dir: t.TempDir()}
	key, _ := os.ReadFile(s.KeyFile)
	for path, b := range map[string][]byte{other.ClientKey(): key, other.HostPubKey(): s.HostKey.AuthorizedKey} {
		os.MkdirAll(filepath.Dir(path), 0o700)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d := newProcessDriver(t)
	// The VM's own keys are not the sshd's: only the other VM's log in.
	m := machineOf(d, sshx.Target{Addr: s.Addr, User: s.User, KeyFile: "/nonexistent", KnownHosts: "/nonexistent"})
	m.Report = func(string, time.Duration, string) {}
	w := m.Begin(context.Background(), time.Minute)
	defer w.Done()
	known := filepath.Join(t.TempDir(), "known_hosts")
	out, err := w.As(other, known, "id -u; cat\n")
	if err != nil || out != "0\n" {
		t.Fatalf("As: %q, %v; want the script's output as root", out, err)
	}
	if _, err := os.Stat(known); !os.IsNotExist(err) {
		t.Errorf("the known_hosts file As wrote is left: %v", err)
	}
	if len(d.ready) != 0 {
		t.Error("As marked the machine ready: only SSH with the VM's own keys does")
	}

	// Another host key: not that VM.
	stranger, _ := sshkeys.Generate("another VM's host")
	if err := os.WriteFile(other.HostPubKey(), stranger.AuthorizedKey, 0o600); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = w.As(other, known, "true\n")
	var be *Error
	if !errors.Is(err, sshx.ErrHostKeyMismatch) || !errors.As(err, &be) || be.Phase != "waiting for SSH as the VM it was made from" {
		t.Errorf("As against another host key: %v; want a boot.Error in the SSH phase, a host key mismatch", err)
	}
	if time.Since(began) > 20*time.Second {
		t.Errorf("As retried a host key mismatch for %s", time.Since(began))
	}

	os.Remove(other.HostPubKey())
	if _, err := w.As(other, known, "true\n"); err == nil || !strings.Contains(err.Error(), other.HostPubKey()) {
		t.Errorf("As without the other VM's host key: %v; want the file named", err)
	}
}
