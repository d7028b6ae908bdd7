package qemu

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/sharejail"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// These tests run real QEMU processes with a real kernel that boots to a
// panic (no root file system) and then sits there: enough to exercise the
// launcher's process, QMP, virtiofsd and stop handling without a disk image.
// Full boots with SSH are in internal/vm.

func testLauncher(t *testing.T) *Launcher {
	t.Helper()
	tu.Program(t, "qemu-system-x86_64")
	l, err := NewLauncher(execx.OS{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testMachine(t *testing.T) (Machine, Boot) {
	t.Helper()
	kernel := tu.Kernel(t)
	dir := t.TempDir()
	ws := filepath.Join(dir, "workspace")
	os.Mkdir(ws, 0o755)
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("secret\n"), 0o600)
	sshPort, _ := ports.Pick(ports.Range{Lo: 30000, Hi: 30999}, nil, ports.Listenable)
	m := Machine{Machine: driver.Machine{Name: "agent-vm-test", UUID: state.NewID(), CPUs: 1, MemoryMiB: 256,
		RunDir: filepath.Join(dir, "run"), LogsDir: filepath.Join(dir, "logs"),
		Share:       driver.Share{Source: ws, Tag: "workspace"},
		Forwards:    []driver.Forward{{Name: "ssh", Host: sshPort, Guest: 22}},
		Credentials: []driver.Credential{{Name: "agent-vm.mcp-token", File: token}}}}
	b := Boot{Direct: &Direct{Kernel: kernel, Append: "console=ttyS0 panic=0"}}
	return m, b
}

func findVirtiofsd(t *testing.T, l *Launcher) *virtiofsd.Binary {
	v, err := virtiofsd.Find(context.Background(), l.Run)
	tu.Need(t, err == nil, "virtiofsd is missing")
	tu.Need(t, os.Geteuid() == 0 || v.Rust, "QEMU's C virtiofsd needs root")
	return v
}

func mustStart(t *testing.T, l *Launcher, m Machine, b Boot, o StartOptions) *Launch {
	t.Helper()
	launch, err := l.Start(context.Background(), m, b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proc.Kill(launch.QEMUPid, isQEMUFor(m.UUID))
		if launch.VirtiofsdPid != 0 {
			proc.Kill(launch.VirtiofsdPid, virtiofsd.Serving(m.sockFile(VirtiofsdSock)))
		}
	})
	return launch
}

func TestStartInspectStopWithVirtiofs(t *testing.T) {
	l := testLauncher(t)
	m, b := testMachine(t)
	launch := mustStart(t, l, m, b, StartOptions{Accel: "tcg", Virtiofsd: findVirtiofsd(t, l)})
	if launch.Share != driver.ShareVirtiofs || launch.VirtiofsdPid == 0 {
		t.Fatalf("launch %+v: want a virtiofs share", launch)
	}
	live, err := l.Inspect(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	if live.State != driver.StateRunning || live.Pid != launch.QEMUPid || live.QMPStatus != "running" {
		t.Errorf("live %+v", live)
	}
	// The secret reached QEMU as a file name, never as a value.
	args := proc.Args(launch.QEMUPid)
	if !hasArg(args, "-sandbox", Sandbox(nil, m.Network != nil).Option()) {
		t.Errorf("QEMU runs without its sandbox: %q", args)
	}
	if fi, err := os.Stat(m.QMPPath()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("QMP socket: %v, %v; want mode 0600", fi.Mode(), err)
	}
	if strings.Contains(strings.Join(args, " "), "secret") {
		t.Error("the credential's content is on QEMU's command line")
	}
	if _, err := l.Start(context.Background(), m, b, StartOptions{Accel: "tcg"}); !errors.Is(err, driver.ErrRunning) {
		t.Errorf("second start: got %v, want driver.ErrRunning", err)
	}

	// The kernel sits in a panic and ignores ACPI: Stop falls through to QMP
	// quit after the grace period.
	if err := l.Stop(context.Background(), m, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if proc.Args(launch.QEMUPid) != nil {
		t.Error("QEMU still running after stop")
	}
	if proc.Args(launch.VirtiofsdPid) != nil {
		t.Error("virtiofsd still running after stop")
	}
	if live, _ := l.Inspect(context.Background(), m); live.State != driver.StateStopped {
		t.Errorf("after stop: %+v", live)
	}
	if err := l.Stop(context.Background(), m, time.Second); !errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("stop of a stopped VM: %v", err)
	}
}

// Run as root, QEMU drops to the workspace's owner once it has opened its
// files, under its sandbox, and still answers QMP and stops.
func TestRootDropsQEMUToTheWorkspaceOwner(t *testing.T) {
	l := testLauncher(t)
	tu.Need(t, os.Geteuid() == 0, "dropping privileges needs root")
	m, b := testMachine(t)
	m.Share.UID, m.Share.GID = 65534, 65534
	launch := mustStart(t, l, m, b, StartOptions{Accel: "tcg"})
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(launch.QEMUPid) + "/status")
	if !strings.Contains(string(status), "\nUid:\t65534\t65534\t65534\t65534\n") || !strings.Contains(string(status), "\nGid:\t65534\t65534\t65534\t65534\n") {
		t.Errorf("QEMU's ids are not the owner's:\n%s", status)
	}
	if live, _ := l.Inspect(context.Background(), m); live.State != driver.StateRunning || live.QMPStatus != "running" {
		t.Errorf("live %+v", live)
	}
	if err := l.Stop(context.Background(), m, time.Second); err != nil {
		t.Fatal(err)
	}
}

// As root, QEMU's C virtiofsd runs in the jail (package sharejail) as the
// workspace's owner: QEMU connects to it, and nothing of it runs as root
// but the jail waiting for it.
func TestRootJailsVirtiofsd(t *testing.T) {
	l := testLauncher(t)
	v := findVirtiofsd(t, l)
	tu.Need(t, os.Geteuid() == 0 && !v.Rust, "the jail is for QEMU's C virtiofsd run as root")
	m, b := testMachine(t)
	os.Chown(m.Share.Source, 65534, 65534)
	m.Share.UID, m.Share.GID = 65534, 65534
	launch := mustStart(t, l, m, b, StartOptions{Accel: "tcg", Virtiofsd: v, NoFallback: true})
	if launch.Share != driver.ShareVirtiofs {
		t.Fatalf("launch %+v", launch)
	}
	if args := proc.Args(launch.VirtiofsdPid); len(args) < 2 || args[1] != sharejail.Command {
		t.Errorf("virtiofsd pid %d is %q, not the jail", launch.VirtiofsdPid, args)
	}
	kids, _ := os.ReadFile("/proc/" + strconv.Itoa(launch.VirtiofsdPid) + "/task/" + strconv.Itoa(launch.VirtiofsdPid) + "/children")
	child := strings.Fields(string(kids))
	if len(child) != 1 {
		t.Fatalf("the jail has children %q", kids)
	}
	status, _ := os.ReadFile("/proc/" + child[0] + "/status")
	if !strings.Contains(string(status), "\nUid:\t65534\t65534\t65534\t65534\n") || !strings.Contains(string(status), "\nSeccomp:\t2\n") {
		t.Errorf("virtiofsd is not the owner under a filter:\n%s", status)
	}
	if err := l.Stop(context.Background(), m, time.Second); err != nil {
		t.Fatal(err)
	}
	if proc.Args(launch.VirtiofsdPid) != nil {
		t.Error("the jail still runs after stop")
	}
}

func TestKilledQEMUReadsAsCrashedAndRestarts(t *testing.T) {
	l := testLauncher(t)
	m, b := testMachine(t)
	launch := mustStart(t, l, m, b, StartOptions{Accel: "tcg"})
	if launch.Share != driver.Share9p {
		t.Errorf("without virtiofsd the share must be 9p, got %s", launch.Share)
	}
	syscall.Kill(launch.QEMUPid, syscall.SIGKILL)
	proc.WaitGone(launch.QEMUPid, isQEMUFor(m.UUID), 5*time.Second)
	live, _ := l.Inspect(context.Background(), m)
	if live.State != driver.StateCrashed || live.Detail == "" {
		t.Fatalf("after SIGKILL: %+v", live)
	}
	again := mustStart(t, l, m, b, StartOptions{Accel: "tcg"})
	if live, _ := l.Inspect(context.Background(), m); live.State != driver.StateRunning || live.Pid != again.QEMUPid {
		t.Errorf("after restart: %+v", live)
	}
	l.Stop(context.Background(), m, time.Second)
}

func TestGuestPowerOffReadsAsStopped(t *testing.T) {
	l := testLauncher(t)
	m, b := testMachine(t)
	launch := mustStart(t, l, m, b, StartOptions{Accel: "tcg"})
	syscall.Kill(launch.QEMUPid, syscall.SIGKILL)
	proc.WaitGone(launch.QEMUPid, isQEMUFor(m.UUID), 5*time.Second)
	f, _ := os.OpenFile(m.ConsoleLogPath(), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	f.WriteString("[   42.0] reboot: Power down\n")
	f.Close()
	if live, _ := l.Inspect(context.Background(), m); live.State != driver.StateStopped || !strings.Contains(live.Detail, "powered itself off") {
		t.Errorf("got %+v", live)
	}
}

// A pid file whose PID now belongs to another process is not this VM: it
// reads as not running, and stop leaves that process alone.
func TestStalePidIsLeftAlone(t *testing.T) {
	l := testLauncher(t)
	m, _ := testMachine(t)
	other := exec.Command("sleep", "300")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Process.Kill()
	os.MkdirAll(m.RunDir, 0o700)
	writeJSON(m.runFile(LaunchFile), &Launch{QEMUPid: other.Process.Pid, Accel: "tcg"})
	os.WriteFile(m.runFile(PidFile), []byte(itoa(other.Process.Pid)+"\n"), 0o600)
	live, _ := l.Inspect(context.Background(), m)
	if live.Alive() {
		t.Fatalf("a foreign process read as this VM: %+v", live)
	}
	if err := l.Stop(context.Background(), m, time.Second); !errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("stop: %v", err)
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Error("stop signalled a process that is not this VM's QEMU")
	}
}

func TestPortTakenFailsEarlyAndLeavesNothing(t *testing.T) {
	l := testLauncher(t)
	m, b := testMachine(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	m.Forwards[0].Host = ln.Addr().(*net.TCPAddr).Port
	_, err = l.Start(context.Background(), m, b, StartOptions{Accel: "tcg"})
	if !errors.Is(err, ports.ErrTaken) || !strings.Contains(err.Error(), itoa(m.Forwards[0].Host)) {
		t.Errorf("got %v, want a port-taken error naming the port", err)
	}
	if _, err := os.Stat(m.runFile(LaunchFile)); err == nil {
		t.Error("a failed start left launch.json")
	}
}

func TestQEMUFailureIsExplainedAndCleansUp(t *testing.T) {
	l := testLauncher(t)
	m, b := testMachine(t)
	b.Direct.Kernel = filepath.Join(t.TempDir(), "no-such-kernel")
	v := findVirtiofsd(t, l)
	_, err := l.Start(context.Background(), m, b, StartOptions{Accel: "tcg", Virtiofsd: v})
	if err == nil || !strings.Contains(err.Error(), "no-such-kernel") {
		t.Fatalf("got %v, want QEMU's own complaint about the kernel", err)
	}
	// virtiofsd was started first and must be gone.
	out, _ := exec.Command("pgrep", "-f", m.sockFile(VirtiofsdSock)).Output()
	if len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("virtiofsd left running: %s", out)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
