package qemu

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/proc"
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
