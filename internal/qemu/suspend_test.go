package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qemu/qemutest"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// These tests suspend and resume a FAKE QEMU and virtiofsd (qemutest: this
// test binary, re-executed as the launcher's QEMU binary) through the real
// launcher: the QMP commands the fake logs are the sequence under test,
// and the state file it writes through the descriptor it was handed is
// read back on resume. The guest's side is the hooks, which record their
// calls. Real boots are in internal/vm (TestSuspendResume).

// fakeDirect is a launcher whose QEMU binary is the fake, and a Direct
// boot of a machine sharing dir over virtiofs.
func fakeDirect(t *testing.T) (*Launcher, Machine, Boot, StartOptions) {
	t.Helper()
	exe, _, err := qemutest.Script(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(qemutest.FakeEnv, "qemu")
	l := &Launcher{Run: execx.OS{}, Log: hclog.NewNullLogger(), Arch: Arch{Binary: exe, Machine: "q35", Console: "ttyS0"},
		PortFree: func(int) bool { return true }, NoSandbox: true}
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.qcow2")
	if err := os.WriteFile(disk, []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := Machine{Machine: driver.Machine{Name: "agent-vm-fake", UUID: state.NewID(), CPUs: 1, MemoryMiB: 256,
		RunDir: filepath.Join(dir, "run"), LogsDir: filepath.Join(dir, "logs"),
		Share: driver.Share{Source: dir, Tag: "workspace"}}}
	m.SocketDir = SocketDirFor(m.RunDir, m.UUID)
	if m.SocketDir != m.RunDir {
		t.Cleanup(func() { os.RemoveAll(m.SocketDir) })
	}
	b := Boot{Direct: &Direct{Disks: []Disk{{Path: disk, Format: "qcow2"}}}}
	o := StartOptions{Accel: "tcg", Virtiofsd: &virtiofsd.Binary{Path: exe, Rust: true}, NoFallback: true}
	return l, m, b, o
}

// hooks records the guest side's calls; detachErr fails Detach.
type hooks struct {
	calls     []string
	detachErr error
}

func (h *hooks) guest() driver.GuestHooks {
	return driver.GuestHooks{
		Detach: func(context.Context) error { h.calls = append(h.calls, "detach"); return h.detachErr },
		Attach: func(context.Context) error { h.calls = append(h.calls, "attach"); return nil },
	}
}

// qmpLog is the QMP commands the fake got since its start, in order.
func qmpLog(t *testing.T, m Machine) []string {
	t.Helper()
	b, err := os.ReadFile(m.QEMULogPath())
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, line := range strings.Split(string(b), "\n") {
		if c, ok := strings.CutPrefix(line, "qmp: "); ok && c != "qmp_capabilities" && c != "query-status" && c != "query-migrate" {
			cmds = append(cmds, c)
		}
	}
	return cmds
}

func startFake(t *testing.T, l *Launcher, m Machine, b Boot, o StartOptions) *Launch {
	t.Helper()
	launch := mustStart(t, l, m, b, o)
	args := proc.Args(launch.QEMUPid)
	if !slices.Contains(args, "pcie-root-port,id="+ShareSlot+",bus=pcie.0,chassis=1") ||
		!slices.Contains(args, "vhost-user-fs-pci,chardev="+ShareChardev+",tag=workspace,id="+ShareDevice+",bus="+ShareSlot) {
		t.Fatalf("the share is not on its hot-pluggable slot: %q", args)
	}
	return launch
}

func TestSuspendThenResume(t *testing.T) {
	l, m, b, o := fakeDirect(t)
	ctx := context.Background()
	launch := startFake(t, l, m, b, o)
	h := &hooks{}
	if err := l.Suspend(ctx, m, h.guest(), o.Virtiofsd); err != nil {
		t.Fatal(err)
	}
	want := []string{"device_del", "chardev-remove", "stop", "getfd", "migrate", "quit"}
	if got := qmpLog(t, m); !slices.Equal(got, want) {
		t.Errorf("suspend's QMP commands: got %q, want %q", got, want)
	}
	if !slices.Equal(h.calls, []string{"detach"}) {
		t.Errorf("guest hooks: got %q, want detach only", h.calls)
	}
	if Running(m, launch.QEMUPid) || proc.Verified(launch.VirtiofsdPid, virtiofsd.Serving(m.sockFile(VirtiofsdSock))) {
		t.Error("QEMU or virtiofsd still runs after suspend")
	}
	fi, err := os.Stat(m.runFile(StateFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v, mode %v; want 0600", err, fi)
	}
	if b, _ := os.ReadFile(m.runFile(StateFile)); string(b) != qemutest.StateMagic+m.UUID+"\n" {
		t.Errorf("state file holds %q, not what QEMU wrote", b)
	}
	s, err := readSavedState(m)
	if err != nil {
		t.Fatal(err)
	}
	if s.QEMU != qemutest.Version || s.Share != driver.ShareVirtiofs || len(s.Disks) != 1 || s.Disks[0].Path != b.Direct.Disks[0].Path || s.RAMApart {
		t.Errorf("saved state's record: %+v", s)
	}
	if exists(m.runFile(RAMFile)) {
		t.Error("QEMU 8.2 would keep the memfd's RAM in the stream, yet it was saved apart too")
	}
	if live, _ := l.Inspect(ctx, m); live.State != driver.StateSuspended {
		t.Errorf("after suspend: state %s, want suspended", live.State)
	}
	if _, err := l.Start(ctx, m, b, o); !errors.Is(err, driver.ErrSuspended) {
		t.Errorf("a cold start of a suspended VM: got %v, want ErrSuspended", err)
	}

	resumed, err := l.Resume(ctx, m, b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Kill(resumed.QEMUPid, m.isQEMU()) })
	want = []string{"getfd", "migrate-incoming", "cont", "getfd", "chardev-remove", "chardev-add", "device_add"}
	if got := qmpLog(t, m); !slices.Equal(got, want) {
		t.Errorf("resume's QMP commands: got %q, want %q", got, want)
	}
	args := proc.Args(resumed.QEMUPid)
	if !hasArg(args, "-incoming", "defer") || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "vhost-user-fs-pci") }) {
		t.Errorf("resumed QEMU's command line: %q", args)
	}
	live, err := l.Inspect(ctx, m)
	if err != nil || live.State != driver.StateRunning || live.Launch.VirtiofsdPid == 0 || !proc.Verified(live.Launch.VirtiofsdPid, virtiofsd.Serving(m.sockFile(VirtiofsdSock))) {
		t.Errorf("after resume: %+v, %v; want running with a live virtiofsd recorded", live, err)
	}
	if hasSavedState(m) || exists(m.runFile(StateFile)) {
		t.Error("the loaded state is still there")
	}
	if head, tail, _ := guestMemory(t, m, resumed.QEMUPid); head != qemutest.MemoryPattern || tail != qemutest.MemoryPattern {
		t.Errorf("the resumed memory reads %q ... %q", head, tail)
	}
}

// With QEMU 7.2, whose x-ignore-shared leaves the memfd out of the stream,
// a suspend copies the guest's RAM to RAMFile (its data only) and the
// stream holds the rest; a resume writes the RAM back into the new QEMU's
// fresh memfd before the load, which must have the capability too (the
// fake's load fails otherwise, and without it would write the RAM
// itself).
func TestSuspendSavesTheRAMApart(t *testing.T) {
	t.Setenv(qemutest.VersionEnv, "7.2.0")
	l, m, b, o := fakeDirect(t)
	ctx := context.Background()
	startFake(t, l, m, b, o)
	if err := l.Suspend(ctx, m, (&hooks{}).guest(), o.Virtiofsd); err != nil {
		t.Fatal(err)
	}
	want := []string{"device_del", "chardev-remove", "stop", "migrate-set-capabilities", "getfd", "migrate", "quit"}
	if got := qmpLog(t, m); !slices.Equal(got, want) {
		t.Errorf("suspend's QMP commands: got %q, want %q", got, want)
	}
	if b, _ := os.ReadFile(m.runFile(StateFile)); string(b) != qemutest.StateMagic+m.UUID+" ignore-shared\n" {
		t.Errorf("state file holds %q, want one saved with x-ignore-shared", b)
	}
	fi, err := os.Stat(m.runFile(RAMFile))
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != int64(m.MemoryMiB)<<20 {
		t.Fatalf("RAM file: %v, %v; want mode 0600 and the memory's size", err, fi)
	}
	ram, err := os.ReadFile(m.runFile(RAMFile))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(qemutest.MemoryPattern); string(ram[:n]) != qemutest.MemoryPattern || string(ram[len(ram)-n:]) != qemutest.MemoryPattern {
		t.Errorf("the RAM file does not hold the guest's memory: %q ... %q", ram[:n], ram[len(ram)-n:])
	}
	s, err := readSavedState(m)
	if err != nil {
		t.Fatal(err)
	}
	if !s.RAMApart || s.Version != savedStateVersion || s.QEMU != "7.2.0" {
		t.Errorf("saved state's record: %+v, want the RAM apart", s)
	}
	resumed, err := l.Resume(ctx, m, b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Kill(resumed.QEMUPid, m.isQEMU()) })
	want = []string{"migrate-set-capabilities", "getfd", "migrate-incoming", "cont", "getfd", "chardev-remove", "chardev-add", "device_add"}
	if got := qmpLog(t, m); !slices.Equal(got, want) {
		t.Errorf("resume's QMP commands: got %q, want %q", got, want)
	}
	if head, tail, _ := guestMemory(t, m, resumed.QEMUPid); head != qemutest.MemoryPattern || tail != qemutest.MemoryPattern {
		t.Errorf("the resumed memory reads %q ... %q, not the saved RAM", head, tail)
	}
	if hasSavedState(m) || exists(m.runFile(StateFile)) || exists(m.runFile(RAMFile)) {
		t.Error("the loaded state or its RAM is still there")
	}
}

// A version 1 record (before the RAM was saved apart) still resumes: its
// stream holds the RAM. One from a newer agent-vm is refused, kept.
func TestResumeReadsStateVersions(t *testing.T) {
	l, m, b, o := suspended(t)
	saved, err := readSavedState(m)
	if err != nil {
		t.Fatal(err)
	}
	setVersion := func(t *testing.T, m Machine, v int) {
		s := *saved
		s.Version = v
		b, _ := json.Marshal(s)
		if err := os.WriteFile(m.runFile(StateMeta), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	setVersion(t, m, savedStateVersion+1)
	_, err = l.Resume(context.Background(), m, b, o)
	if !errors.Is(err, driver.ErrStaleState) || !strings.Contains(err.Error(), "version 3, this agent-vm reads 1 to 2") || !exists(m.runFile(StateFile)) {
		t.Errorf("a newer record: got %v, want ErrStaleState naming the versions, the state kept", err)
	}
	setVersion(t, m, 1)
	resumed, err := l.Resume(context.Background(), m, b, o)
	if err != nil {
		t.Fatalf("a version 1 record: %v", err)
	}
	proc.Kill(resumed.QEMUPid, m.isQEMU())
}

func TestRAMApartIn(t *testing.T) {
	for v, want := range map[string]bool{"7.2.22": true, "6.2.0": true, "8.0.5": true, "8.1.0": false, "8.2.2": false, "10.0.3": false, "": false, "x": false} {
		if got := ramApartIn(v); got != want {
			t.Errorf("ramApartIn(%q) = %v, want %v", v, got, want)
		}
	}
}

// A failure past the guest's detach puts everything back: the device and
// its virtiofsd, the CPUs, the guest's mount; no state is left.
func TestSuspendFailureRollsBack(t *testing.T) {
	l, m, b, o := fakeDirect(t)
	t.Setenv(qemutest.FailEnv, "migrate")
	launch := startFake(t, l, m, b, o)
	h := &hooks{}
	err := l.Suspend(context.Background(), m, h.guest(), o.Virtiofsd)
	if err == nil || !strings.Contains(err.Error(), "runs on as before") {
		t.Fatalf("got %v, want a failed suspend that says the VM runs on", err)
	}
	want := []string{"device_del", "chardev-remove", "stop", "getfd", "migrate", "migrate_cancel", "cont", "getfd", "chardev-remove", "chardev-add", "device_add"}
	if got := qmpLog(t, m); !slices.Equal(got, want) {
		t.Errorf("QMP commands: got %q, want %q", got, want)
	}
	if !slices.Equal(h.calls, []string{"detach", "attach"}) {
		t.Errorf("guest hooks: got %q, want detach, attach", h.calls)
	}
	live, _ := l.Inspect(context.Background(), m)
	if live.State != driver.StateRunning || live.Pid != launch.QEMUPid || !proc.Verified(live.Launch.VirtiofsdPid, virtiofsd.Serving(m.sockFile(VirtiofsdSock))) {
		t.Errorf("after the failed suspend: %+v", live)
	}
	if exists(m.runFile(StateFile)) || exists(m.runFile(StateFile+".tmp")) || hasSavedState(m) {
		t.Error("a failed suspend left a state file")
	}
}

// The same with the RAM saved apart: its file goes, and the capability
// is set back before the CPUs run (a later save into the stream must not
// leave the RAM out).
func TestSuspendFailureRollsBackTheRAMApart(t *testing.T) {
	t.Setenv(qemutest.VersionEnv, "7.2.0")
	l, m, b, o := fakeDirect(t)
	t.Setenv(qemutest.FailEnv, "migrate")
	startFake(t, l, m, b, o)
	err := l.Suspend(context.Background(), m, (&hooks{}).guest(), o.Virtiofsd)
	if err == nil || !strings.Contains(err.Error(), "runs on as before") {
		t.Fatalf("got %v, want a failed suspend that says the VM runs on", err)
	}
	want := []string{"device_del", "chardev-remove", "stop", "migrate-set-capabilities", "getfd", "migrate", "migrate_cancel", "migrate-set-capabilities", "cont", "getfd", "chardev-remove", "chardev-add", "device_add"}
	if got := qmpLog(t, m); !slices.Equal(got, want) {
		t.Errorf("QMP commands: got %q, want %q", got, want)
	}
	if exists(m.runFile(RAMFile)) || exists(m.runFile(RAMFile+".part")) || hasSavedState(m) {
		t.Error("a failed suspend left its RAM file")
	}
}

// Refusals before anything changes: no QMP command but the greeting's.
func TestSuspendRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("stopped", func(t *testing.T) {
		l, m, _, o := fakeDirect(t)
		h := &hooks{}
		if err := l.Suspend(ctx, m, h.guest(), o.Virtiofsd); !errors.Is(err, driver.ErrNotRunning) || len(h.calls) != 0 {
			t.Errorf("got %v (hooks %q), want ErrNotRunning and no guest call", err, h.calls)
		}
	})
	t.Run("no slot", func(t *testing.T) {
		// A run script's machine (NixOS) has no hot-pluggable slot.
		l, m, b, launch := fakeStart(t, "")
		_ = b
		h := &hooks{}
		err := l.Suspend(ctx, m, h.guest(), &virtiofsd.Binary{})
		if !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), "agent-vm restart") || len(h.calls) != 0 {
			t.Errorf("got %v (hooks %q), want ErrUnsupported with a hint and no guest call", err, h.calls)
		}
		if !Running(m, launch.QEMUPid) {
			t.Error("the refused suspend ended QEMU")
		}
	})
	t.Run("guest refuses", func(t *testing.T) {
		l, m, b, o := fakeDirect(t)
		launch := startFake(t, l, m, b, o)
		busy := errors.New("processes use /workspace: 42 bash")
		h := &hooks{detachErr: busy}
		if err := l.Suspend(ctx, m, h.guest(), o.Virtiofsd); !errors.Is(err, busy) {
			t.Errorf("got %v, want the guest's refusal as is", err)
		}
		if got := qmpLog(t, m); len(got) != 0 {
			t.Errorf("QMP commands after the guest refused: %q", got)
		}
		if !Running(m, launch.QEMUPid) || hasSavedState(m) {
			t.Error("the refused suspend changed the VM")
		}
	})
}

// suspended leaves a machine suspended by the fake.
func suspended(t *testing.T) (*Launcher, Machine, Boot, StartOptions) {
	t.Helper()
	l, m, b, o := fakeDirect(t)
	startFake(t, l, m, b, o)
	if err := l.Suspend(context.Background(), m, (&hooks{}).guest(), o.Virtiofsd); err != nil {
		t.Fatal(err)
	}
	return l, m, b, o
}

// A saved state that no longer fits is refused before anything starts,
// with the way out, and kept.
func TestResumeRefusesAStaleState(t *testing.T) {
	edit := func(t *testing.T, m Machine, f func(*savedState)) {
		s, err := readSavedState(m)
		if err != nil {
			t.Fatal(err)
		}
		f(s)
		b, _ := json.Marshal(s)
		if err := os.WriteFile(m.runFile(StateMeta), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, m *Machine, b Boot)
		want   string
	}{
		{"qemu version", func(t *testing.T, m *Machine, _ Boot) {
			edit(t, *m, func(s *savedState) { s.QEMU = "7.1.0" })
		}, "saved by QEMU 7.1.0 and this host's QEMU is " + qemutest.Version},
		{"memory", func(t *testing.T, m *Machine, _ Boot) { m.MemoryMiB = 512 }, `saved "256M", now "512M"`},
		{"disk", func(t *testing.T, _ *Machine, b Boot) {
			os.WriteFile(b.Direct.Disks[0].Path, []byte("booted cold since"), 0o600)
		}, "the disk "},
		{"record", func(t *testing.T, m *Machine, _ Boot) {
			os.WriteFile(m.runFile(StateMeta), []byte("{"), 0o600)
		}, "record is unreadable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, m, b, o := suspended(t)
			tc.change(t, &m, b)
			_, err := l.Resume(context.Background(), m, b, o)
			if !errors.Is(err, driver.ErrStaleState) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "agent-vm start --cold") {
				t.Errorf("got %v, want ErrStaleState saying %q and the way out", err, tc.want)
			}
			if exists(m.QMPPath()) || !exists(m.runFile(StateFile)) {
				t.Error("a refused resume started QEMU or lost the state")
			}
		})
	}
}

func TestStopDiscardsASavedState(t *testing.T) {
	l, m, b, o := suspended(t)
	if err := l.Stop(context.Background(), m, 0); err != nil {
		t.Fatal(err)
	}
	if hasSavedState(m) || exists(m.runFile(StateFile)) {
		t.Error("stop kept the saved state")
	}
	if live, _ := l.Inspect(context.Background(), m); live.State != driver.StateStopped {
		t.Errorf("after stop: %s", live.State)
	}
	if _, err := l.Resume(context.Background(), m, b, o); !errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("resume without a state: got %v, want ErrNotRunning", err)
	}
}
