package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qemu/qemutest"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// These tests run a FAKE QEMU and virtiofsd (qemutest: this test binary,
// re-executed) through the real launcher: real processes with the command
// lines the launcher built, a pid file and a QMP socket.

func TestMain(m *testing.M) {
	qemutest.Main()
	os.Exit(m.Run())
}

// fakeStart starts the fake QEMU, with a fake virtiofsd, for a new machine
// in dir (a new temporary directory when "").
func fakeStart(t *testing.T, dir string) (*Launcher, Machine, Boot, *Launch) {
	t.Helper()
	l, err := NewLauncher(execx.OS{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	exe, env, err := qemutest.Script(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(qemutest.FakeEnv, "qemu") // for the virtiofsd, which inherits it
	if dir == "" {
		dir = t.TempDir()
	}
	m := Machine{Machine: driver.Machine{Name: "agent-vm-fake", UUID: state.NewID(), CPUs: 1, MemoryMiB: 256,
		RunDir: filepath.Join(dir, "run"), LogsDir: filepath.Join(dir, "logs"),
		Share: driver.Share{Source: dir, Tag: "workspace"}}}
	m.SocketDir = SocketDirFor(m.RunDir, m.UUID)
	if m.SocketDir != m.RunDir {
		t.Cleanup(func() { os.RemoveAll(m.SocketDir) })
	}
	b := Boot{Script: &Script{Path: exe, Env: env}}
	launch := mustStart(t, l, m, b, StartOptions{Accel: "tcg", Virtiofsd: &virtiofsd.Binary{Path: exe, Rust: true}})
	if launch.VirtiofsdPid == 0 {
		t.Fatalf("launch %+v: the fake virtiofsd did not start", launch)
	}
	return l, m, b, launch
}

// A torn launch.json (a host crash before it reached the disk) is no dead
// end: the VM is found from its pid file, or failing that the process table,
// and stop ends QEMU through QMP and virtiofsd with it.
func TestUnreadableLaunchFileFindsQEMUInTheProcessTable(t *testing.T) {
	l, m, _, launch := fakeStart(t, "")
	ctx := context.Background()
	if err := os.WriteFile(m.runFile(LaunchFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	live, err := l.Inspect(ctx, m)
	if err != nil || live.State != driver.StateRunning || live.Pid != launch.QEMUPid || !strings.Contains(live.Detail, LaunchFile) {
		t.Fatalf("with an empty %s: got %+v, %v; want running (pid %d), the file named in the detail", LaunchFile, live, err, launch.QEMUPid)
	}
	os.Remove(m.runFile(PidFile))
	if live, err := l.Inspect(ctx, m); err != nil || live.State != driver.StateRunning || live.Pid != launch.QEMUPid {
		t.Fatalf("without the pid file either: got %+v, %v; want running (pid %d)", live, err, launch.QEMUPid)
	}
	if err := l.Stop(ctx, m, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if !proc.WaitGone(launch.QEMUPid, isQEMUFor(m.UUID), 5*time.Second) {
		t.Error("QEMU still runs after stop")
	}
	if !proc.WaitGone(launch.VirtiofsdPid, virtiofsd.Serving(m.sockFile(VirtiofsdSock)), 5*time.Second) {
		t.Error("virtiofsd still runs after stop")
	}
	if log := driver.TailFile(m.QEMULogPath(), 10); !strings.Contains(log, "qmp: system_powerdown") {
		t.Errorf("stop did not ask the guest to power off over QMP; QEMU's log:\n%s", log)
	}
	if live, err := l.Inspect(ctx, m); err != nil || live.State != driver.StateStopped {
		t.Errorf("after stop: got %+v, %v; want stopped", live, err)
	}
}

// After a crash that left launch.json unreadable, the VM reads as crashed
// (saying why) and starts again.
func TestUnreadableLaunchFileAfterACrashReadsCrashedAndStarts(t *testing.T) {
	l, m, b, launch := fakeStart(t, "")
	ctx := context.Background()
	syscall.Kill(launch.QEMUPid, syscall.SIGKILL)
	syscall.Kill(launch.VirtiofsdPid, syscall.SIGKILL)
	proc.WaitGone(launch.QEMUPid, isQEMUFor(m.UUID), 5*time.Second)
	if err := os.WriteFile(m.runFile(LaunchFile), []byte(`{"qemu_pid": 12`), 0o600); err != nil {
		t.Fatal(err)
	}
	live, err := l.Inspect(ctx, m)
	if err != nil || live.State != driver.StateCrashed || !strings.Contains(live.Detail, LaunchFile) {
		t.Fatalf("got %+v, %v; want crashed, the unreadable %s named in the detail", live, err, LaunchFile)
	}
	again := mustStart(t, l, m, b, StartOptions{Accel: "tcg"})
	if live, err := l.Inspect(ctx, m); err != nil || live.State != driver.StateRunning || live.Pid != again.QEMUPid {
		t.Errorf("after the new start: got %+v, %v", live, err)
	}
	if err := l.Stop(ctx, m, 5*time.Second); err != nil {
		t.Error(err)
	}
}

// A virtiofsd that no run file names (agent-vm was killed between starting
// it and QEMU, and launch.json is torn or was never written) is found in the
// process table and stopped.
func TestStopEndsAVirtiofsdNoRunFileNames(t *testing.T) {
	for _, launchFile := range []string{"missing", "empty"} {
		t.Run(launchFile, func(t *testing.T) {
			l, m, _, launch := fakeStart(t, "")
			syscall.Kill(launch.QEMUPid, syscall.SIGKILL)
			proc.WaitGone(launch.QEMUPid, isQEMUFor(m.UUID), 5*time.Second)
			exe, _, _ := qemutest.Script(false)
			vfs, err := l.startVirtiofsd(context.Background(), &virtiofsd.Binary{Path: exe, Rust: true}, m)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proc.Kill(vfs, virtiofsd.Serving(m.sockFile(VirtiofsdSock))) })
			os.Remove(m.runFile(LaunchFile))
			if launchFile == "empty" {
				os.WriteFile(m.runFile(LaunchFile), nil, 0o600)
			}
			if err := l.Stop(context.Background(), m, time.Second); !errors.Is(err, driver.ErrNotRunning) {
				t.Errorf("stop: got %v, want driver.ErrNotRunning", err)
			}
			if !proc.WaitGone(vfs, virtiofsd.Serving(m.sockFile(VirtiofsdSock)), time.Second) {
				t.Error("virtiofsd still runs after stop")
			}
		})
	}
}

// A machine known only by its directories (its record is unreadable) gets
// back, from its running QEMU, the uuid and socket directory (here outside
// the run directory, as long state paths have it) that stop needs to reach
// it over QMP. Another run directory's QEMU is not adopted.
func TestAdoptCompletesAMachineFromItsQEMU(t *testing.T) {
	l, m, _, launch := fakeStart(t, filepath.Join(t.TempDir(), strings.Repeat("long-state-path", 6)))
	if m.SocketDir == m.RunDir {
		t.Fatalf("socket dir %s: want one outside the run dir", m.SocketDir)
	}
	bare := Machine{Machine: driver.Machine{Name: m.Name, RunDir: m.RunDir, LogsDir: m.LogsDir, Share: m.Share}, SocketDir: m.RunDir}
	if _, pid := Adopt(Machine{Machine: driver.Machine{RunDir: m.RunDir + "-2", LogsDir: m.LogsDir}}); pid != 0 {
		t.Errorf("adopted pid %d for a run directory that has no QEMU", pid)
	}
	os.Remove(m.runFile(PidFile)) // found in the process table all the same
	got, pid := Adopt(bare)
	if pid != launch.QEMUPid || got.UUID != m.UUID || got.SocketDir != m.SocketDir {
		t.Fatalf("adopted pid %d as %+v; want pid %d, uuid %s, socket dir %s", pid, got, launch.QEMUPid, m.UUID, m.SocketDir)
	}
	if err := l.Stop(context.Background(), got, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if log := driver.TailFile(m.QEMULogPath(), 10); !strings.Contains(log, "qmp: system_powerdown") {
		t.Errorf("stop did not reach QEMU over QMP; its log:\n%s", log)
	}
}
