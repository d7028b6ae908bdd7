package vm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/qemu/qemutest"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// These tests run a FAKE QEMU and virtiofsd (qemutest: this test binary,
// re-executed with QEMU's command line) through the real launcher, in VM
// directories made by hand; destroy and status are real.

type fakeVM struct {
	Entry  state.Entry
	Mach   qemu.Machine
	Launch *qemu.Launch
}

// vmDir makes the directory of a stopped qemu VM for branch by hand: its
// record, with git, and the workspace that fill makes at the path given.
func vmDir(t *testing.T, m *vm.Manager, branch string, git state.Git, fill func(ws string)) (*state.Record, state.Layout) {
	t.Helper()
	slug, err := state.Slug(branch)
	if err != nil {
		t.Fatal(err)
	}
	st, err := m.Root.BeginCreate(slug)
	if err != nil {
		t.Fatal(err)
	}
	rec := &state.Record{Version: state.RecordVersion, ID: state.NewID(), Branch: branch, Slug: slug, MachineName: "agent-vm-" + slug,
		Backend: vm.BackendQEMU, CreatedAt: time.Now().UTC(), Ports: state.Ports{SSH: 1, MCP: 2},
		Resources: state.Resources{CPUs: 1, MemoryMiB: 256, DiskGiB: 2}, Git: git}
	fill(st.Layout.Workspace())
	if err := state.WriteRecord(st.Layout.Record(), rec); err != nil {
		t.Fatal(err)
	}
	l, err := st.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return rec, l
}

// startFakeVM makes the directory of a VM for branch (its record, an empty
// workspace) and starts the fake QEMU for it, with a fake virtiofsd.
func startFakeVM(t *testing.T, m *vm.Manager, branch string, stubborn bool) fakeVM {
	t.Helper()
	return startFakeVMWith(t, m, branch, state.Git{}, func(ws string) { os.Mkdir(ws, 0o755) }, stubborn)
}

// startFakeVMWith is startFakeVM with the record's git and the workspace
// fill makes.
func startFakeVMWith(t *testing.T, m *vm.Manager, branch string, git state.Git, fill func(ws string), stubborn bool) fakeVM {
	t.Helper()
	rec, l := vmDir(t, m, branch, git, fill)
	// What Manager.machine makes of the record, less the forwards and
	// credentials, which the fake does not use.
	mach := qemu.Machine{Machine: driver.Machine{Name: rec.MachineName, UUID: rec.ID, CPUs: 1, MemoryMiB: 256, RunDir: l.RunDir(), LogsDir: l.LogsDir(),
		Share: driver.Share{Source: l.Workspace(), Tag: guest.ShareTag}}, SocketDir: qemu.SocketDirFor(l.RunDir(), rec.ID)}
	exe, env, err := qemutest.Script(stubborn)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(qemutest.FakeEnv, "qemu") // for the virtiofsd, which inherits it
	launch, err := m.Drivers[qemu.DriverName].(*qemu.Driver).Launcher.Start(context.Background(), mach, qemu.Boot{Script: &qemu.Script{Path: exe, Env: env}},
		qemu.StartOptions{Accel: "tcg", Virtiofsd: &virtiofsd.Binary{Path: exe, Rust: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !strings.HasPrefix(mach.SocketDir, l.Dir) {
			os.RemoveAll(mach.SocketDir)
		}
		if qemu.Running(mach, launch.QEMUPid) {
			syscall.Kill(launch.QEMUPid, syscall.SIGKILL)
		}
		if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(launch.VirtiofsdPid) + "/cmdline"); strings.Contains(string(cmdline), l.Workspace()) {
			syscall.Kill(launch.VirtiofsdPid, syscall.SIGKILL)
		}
	})
	if launch.VirtiofsdPid == 0 {
		t.Fatalf("launch %+v: the fake virtiofsd did not start", launch)
	}
	e, err := m.Find(context.Background(), branch)
	if err != nil {
		t.Fatal(err)
	}
	return fakeVM{Entry: e, Mach: mach, Launch: launch}
}

// gone waits until pid no longer exists (the launcher reaps its children).
func gone(pid int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return tu.Poll(ctx, fmt.Sprintf("pid %d to end", pid), func() bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }) == nil
}

// destroy --force of a VM whose record is unreadable finds its QEMU from
// what the run directory still has and stops it (and its virtiofsd) before
// removing the directory, with or without a readable launch.json. A QEMU of
// another VM, whose command line differs only in its paths and whose pid the
// pid file now names, is left alone.
func TestDestroyForceStopsTheQEMUOfAnUnreadableRecord(t *testing.T) {
	for _, launchFile := range []string{"intact", "empty"} {
		t.Run("launch file "+launchFile, func(t *testing.T) {
			m := plainManager(t)
			mine := startFakeVM(t, m, "feature/x", false)
			other := startFakeVM(t, m, "feature/x-2", false)
			l := mine.Entry.Layout
			os.WriteFile(l.Record(), []byte(`{"version": 1, "id": "`), 0o600)
			os.WriteFile(l.Run(qemu.PidFile), []byte(strconv.Itoa(other.Launch.QEMUPid)+"\n"), 0o600)
			if launchFile == "empty" {
				os.WriteFile(l.Run(qemu.LaunchFile), nil, 0o600)
			}

			res, err := m.Destroy(context.Background(), "feature-x", true)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Stopped {
				t.Error("destroy did not report the VM as stopped")
			}
			if !gone(mine.Launch.QEMUPid) || !gone(mine.Launch.VirtiofsdPid) {
				t.Errorf("destroy left QEMU (pid %d) or virtiofsd (pid %d) running", mine.Launch.QEMUPid, mine.Launch.VirtiofsdPid)
			}
			if _, err := os.Stat(l.Dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the VM directory is still there: %v", err)
			}
			if _, err := os.Stat(mine.Mach.SocketDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the VM's socket directory %s is still there: %v", mine.Mach.SocketDir, err)
			}
			if !qemu.Running(other.Mach, other.Launch.QEMUPid) || syscall.Kill(other.Launch.VirtiofsdPid, 0) != nil {
				t.Error("destroy stopped another VM's QEMU or virtiofsd")
			}
		})
	}
}

// A torn launch.json blocks neither status nor destroy --force.
func TestDestroyForceWithAnUnreadableLaunchFile(t *testing.T) {
	m := plainManager(t)
	v := startFakeVM(t, m, "feature/y", false)
	os.WriteFile(v.Entry.Layout.Run(qemu.LaunchFile), nil, 0o600)

	info := m.Status(context.Background(), v.Entry, false)
	if info.State != vminfo.StateStarting && info.State != vminfo.StateRunning || info.Pid != v.Launch.QEMUPid || !strings.Contains(info.Detail, qemu.LaunchFile) {
		t.Errorf("status: state %q, pid %d, detail %q; want the running QEMU (pid %d) and the unreadable file named", info.State, info.Pid, info.Detail, v.Launch.QEMUPid)
	}
	if _, err := m.Destroy(context.Background(), "feature/y", true); err != nil {
		t.Fatal(err)
	}
	if !gone(v.Launch.QEMUPid) || !gone(v.Launch.VirtiofsdPid) {
		t.Error("destroy left QEMU or virtiofsd running")
	}
	if _, err := os.Stat(v.Entry.Layout.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the VM directory is still there: %v", err)
	}
}

// When the QEMU of a VM with an unreadable record cannot be stopped,
// destroy --force refuses, saying so, and removes nothing: the directory is
// the only handle left on that QEMU.
func TestDestroyForceRefusesWhenQEMUCannotBeStopped(t *testing.T) {
	m := plainManager(t)
	v := startFakeVM(t, m, "feature/z", true)
	l := v.Entry.Layout
	os.WriteFile(l.Record(), nil, 0o600)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	_, err := m.Destroy(ctx, "feature-z", true)
	if err == nil || !strings.Contains(err.Error(), "hint:") || !strings.Contains(err.Error(), strconv.Itoa(v.Launch.QEMUPid)) {
		t.Errorf("got %v, want a refusal naming QEMU's pid, with a hint", err)
	}
	if _, err := os.Stat(l.Record()); err != nil {
		t.Errorf("the VM directory was removed although its QEMU runs: %v", err)
	}
	if !qemu.Running(v.Mach, v.Launch.QEMUPid) {
		t.Error("the stubborn QEMU is gone: the test proves nothing")
	}
}
