package qemu

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestram"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qemu/qemutest"
	"github.com/agent-vm/agent-vm/internal/qmp"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// These tests pause a FAKE QEMU (qemutest, see suspend_test.go) in place
// and continue it: the QMP commands it logs are the sequence under test.
// The real boot is internal/vm's suspendPausesABusyVM (in TestTemplate).

// A pause stops the CPUs and nothing else: the same QEMU and virtiofsd run
// on, Inspect says suspended (paused in place, naming the host RAM it
// holds), a start and a second pause or a save are refused; Continue runs
// the same QEMU again.
func TestPauseThenContinue(t *testing.T) {
	l, m, b, o := fakeDirect(t)
	ctx := context.Background()
	launch := startFake(t, l, m, b, o)
	if err := l.Pause(ctx, m); err != nil {
		t.Fatal(err)
	}
	if got := qmpLog(t, m); !slices.Equal(got, []string{"stop"}) {
		t.Errorf("pause's QMP commands: got %q, want stop only", got)
	}
	live, err := l.Inspect(ctx, m)
	if err != nil || live.State != driver.StateSuspended || live.Suspend != driver.SuspendPaused || live.Pid != launch.QEMUPid || live.Resident <= 0 {
		t.Fatalf("after pause: %+v, %v; want suspended in place, pid %d", live, err, launch.QEMUPid)
	}
	for _, w := range []string{"paused in place since ", "the workspace stays mounted", "MiB of host RAM", "`agent-vm resume fake` continues it"} {
		if !strings.Contains(live.Detail, w) {
			t.Errorf("detail %q lacks %q", live.Detail, w)
		}
	}
	if !proc.Verified(launch.VirtiofsdPid, virtiofsd.Serving(m.sockFile(VirtiofsdSock))) {
		t.Error("virtiofsd ended with the pause")
	}
	if _, err := l.Start(ctx, m, b, o); !errors.Is(err, driver.ErrSuspended) {
		t.Errorf("a start of a paused VM: got %v, want ErrSuspended", err)
	}
	if err := l.Pause(ctx, m); !errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("a second pause: got %v, want ErrNotRunning", err)
	}
	if err := l.Suspend(ctx, m, (&hooks{}).guest(), o.Virtiofsd); err == nil || !strings.Contains(err.Error(), "suspended already") {
		t.Errorf("a save of a paused VM: got %v, want a refusal", err)
	}

	cont, err := l.Continue(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if cont.QEMUPid != launch.QEMUPid {
		t.Errorf("continue's launch names pid %d, the paused QEMU was %d", cont.QEMUPid, launch.QEMUPid)
	}
	if got := qmpLog(t, m); !slices.Equal(got, []string{"stop", "cont"}) {
		t.Errorf("QMP commands: got %q, want stop, cont", got)
	}
	if live, _ := l.Inspect(ctx, m); live.State != driver.StateRunning || live.Suspend != "" || exists(m.runFile(PauseFile)) {
		t.Errorf("after continue: %+v (pause mark there: %v)", live, exists(m.runFile(PauseFile)))
	}
	if _, err := l.Continue(ctx, m); !errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("continue of a running VM: got %v, want ErrNotRunning", err)
	}
}

// A QEMU paused by another hand than Pause (no mark, or a mark of another
// QEMU) is paused, not suspended: resume would not know it.
func TestPausedByOthersIsNotSuspended(t *testing.T) {
	l, m, b, o := fakeDirect(t)
	ctx := context.Background()
	launch := startFake(t, l, m, b, o)
	c, err := qmp.Dial(ctx, m.QMPPath())
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Execute(ctx, "stop", nil)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if live, _ := l.Inspect(ctx, m); live.State != driver.StatePaused || live.Suspend != "" {
		t.Errorf("stopped over QMP: %+v, want paused and not suspended", live)
	}
	if err := writeJSON(m.runFile(PauseFile), pauseMark{QEMUPid: launch.QEMUPid + 1, PausedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if live, _ := l.Inspect(ctx, m); live.State != driver.StatePaused || live.Suspend != "" {
		t.Errorf("with another QEMU's pause mark: %+v, want paused and not suspended", live)
	}
}

// Stop continues a paused VM before its power-off, so that the guest can
// answer it; the QEMU ends and the mark goes.
func TestStopAPausedVM(t *testing.T) {
	l, m, b, o := fakeDirect(t)
	ctx := context.Background()
	launch := startFake(t, l, m, b, o)
	if err := l.Pause(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := l.Stop(ctx, m, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := qmpLog(t, m); !slices.Equal(got, []string{"stop", "cont", "system_powerdown"}) {
		t.Errorf("QMP commands: got %q, want stop, cont, system_powerdown", got)
	}
	if Running(m, launch.QEMUPid) || exists(m.runFile(PauseFile)) {
		t.Error("QEMU or its pause mark is left after stop")
	}
	if live, _ := l.Inspect(ctx, m); live.State != driver.StateStopped {
		t.Errorf("after stop: %+v", live)
	}
}

// guestMemory reads the fake QEMU's guest memory (its memfd): the pattern
// at its start and end, and how much of it is in host memory.
func guestMemory(t *testing.T, m Machine, pid int) (head, tail string, resident int64) {
	t.Helper()
	mem, err := guestram.Open(pid, int64(m.MemoryMiB)<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	b := make([]byte, len(qemutest.MemoryPattern))
	if _, err := mem.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	head = string(b)
	if _, err := mem.ReadAt(b, int64(m.MemoryMiB)<<20-int64(len(b))); err != nil {
		t.Fatal(err)
	}
	resident, _ = guestram.Resident(mem)
	return head, string(b), resident
}

// Hibernate pauses as Pause does and moves the guest's memory to a file:
// Inspect says hibernated, the memfd holds nothing, a start is refused;
// Continue brings the memory back before cont, and the file goes.
func TestHibernateThenContinue(t *testing.T) {
	l, m, b, o := fakeDirect(t)
	ctx := context.Background()
	launch := startFake(t, l, m, b, o)
	if err := l.Hibernate(ctx, m); err != nil {
		t.Fatal(err)
	}
	live, err := l.Inspect(ctx, m)
	if err != nil || live.State != driver.StateSuspended || live.Suspend != driver.SuspendHibernated || !live.InPlace() || live.Pid != launch.QEMUPid {
		t.Fatalf("after hibernate: %+v, %v", live, err)
	}
	if !strings.Contains(live.Detail, "hibernated (its memory, ") || !Hibernated(m.RunDir) {
		t.Errorf("detail %q, Hibernated %v", live.Detail, Hibernated(m.RunDir))
	}
	if head, tail, res := guestMemory(t, m, launch.QEMUPid); head == qemutest.MemoryPattern || tail == qemutest.MemoryPattern || res != 0 {
		t.Errorf("the guest's memory stayed in QEMU: %q %q, %d bytes resident", head, tail, res)
	}
	if !exists(m.runFile(MemoryFile)) {
		t.Fatal("no memory file")
	}
	if _, err := l.Start(ctx, m, b, o); !errors.Is(err, driver.ErrSuspended) {
		t.Errorf("a start of a hibernated VM: got %v, want ErrSuspended", err)
	}
	if _, err := l.Continue(ctx, m); err != nil {
		t.Fatal(err)
	}
	if head, tail, _ := guestMemory(t, m, launch.QEMUPid); head != qemutest.MemoryPattern || tail != qemutest.MemoryPattern {
		t.Errorf("the memory came back as %q ... %q", head, tail)
	}
	if got := qmpLog(t, m); !slices.Equal(got, []string{"stop", "cont"}) {
		t.Errorf("QMP commands: got %q, want stop, cont", got)
	}
	if live, _ := l.Inspect(ctx, m); live.State != driver.StateRunning || exists(m.runFile(MemoryFile)) || Hibernated(m.RunDir) {
		t.Errorf("after continue: %+v (memory file there: %v)", live, exists(m.runFile(MemoryFile)))
	}
}

// A memory file that cannot be read back keeps the CPUs stopped: a guest
// run on emptied memory would be lost.
func TestContinueWithoutTheMemoryFile(t *testing.T) {
	l, m, b, o := fakeDirect(t)
	ctx := context.Background()
	startFake(t, l, m, b, o)
	if err := l.Hibernate(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(m.runFile(MemoryFile), 10); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Continue(ctx, m); err == nil || !strings.Contains(err.Error(), "its CPUs stay stopped") {
		t.Fatalf("continue with a torn memory file: %v", err)
	}
	if got := qmpLog(t, m); !slices.Equal(got, []string{"stop"}) {
		t.Errorf("QMP commands: got %q, want stop only", got)
	}
	// Stop does not run the guest either: it ends the QEMU.
	if err := l.Stop(ctx, m, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := qmpLog(t, m); slices.Contains(got, "cont") {
		t.Errorf("QMP commands: %q, want no cont", got)
	}
	if exists(m.runFile(MemoryFile)) || exists(m.runFile(PauseFile)) {
		t.Error("the stopped VM's memory file or mark is left")
	}
}

// Stop of a hibernated VM brings its memory back and continues it, so its
// guest powers off cleanly.
func TestStopAHibernatedVM(t *testing.T) {
	l, m, b, o := fakeDirect(t)
	ctx := context.Background()
	startFake(t, l, m, b, o)
	if err := l.Hibernate(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := l.Stop(ctx, m, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := qmpLog(t, m); !slices.Equal(got, []string{"stop", "cont", "system_powerdown"}) {
		t.Errorf("QMP commands: got %q, want stop, cont, system_powerdown", got)
	}
	if exists(m.runFile(MemoryFile)) {
		t.Error("the memory file is left")
	}
}

// A QEMU whose memory is not agent-vm's memfd cannot hibernate: refused
// with ErrUnsupported, and the VM runs on.
func TestHibernateRefusedRunsOn(t *testing.T) {
	l, m, b, o := fakeDirect(t)
	ctx := context.Background()
	startFake(t, l, m, b, o)
	m.MemoryMiB *= 2 // not the size of the fake's memfd
	if err := l.Hibernate(ctx, m); !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), "the VM runs on") {
		t.Fatalf("hibernate: %v", err)
	}
	if live, _ := l.Inspect(ctx, m); live.State != driver.StateRunning || exists(m.runFile(MemoryFile)) {
		t.Errorf("after a refused hibernate: %+v", live)
	}
	if got := qmpLog(t, m); !slices.Equal(got, []string{"stop", "cont"}) {
		t.Errorf("QMP commands: got %q, want stop, cont", got)
	}
}
