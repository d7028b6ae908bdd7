package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qmp"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// Live is a VM's live state, read from its pid and QMP (never over SSH).
type Live struct {
	State     string
	Detail    string // e.g. "guest powered itself off", "QMP did not answer"
	Suspend   string // driver.SuspendPaused, SuspendHibernated or SuspendSaved when suspended
	Resident  int64  // host RAM its QEMU holds (bytes): read when paused in place
	Pid       int
	Launch    *Launch // what the last start recorded; nil if never started
	QMPStatus string  // QEMU's own run state, when QMP answered
	// LaunchErr is why launch.json, which exists, could not be read (then
	// Launch is nil and the state comes from the process table).
	LaunchErr error
}

// Alive reports whether a QEMU process of this VM exists.
func (lv Live) Alive() bool { return lv.State == driver.StateRunning || lv.State == driver.StatePaused }

// InPlace reports whether the VM is suspended in place (Pause, Hibernate).
func (lv Live) InPlace() bool {
	return lv.Suspend == driver.SuspendPaused || lv.Suspend == driver.SuspendHibernated
}

// Uptime is how long the VM has been running.
func (lv Live) Uptime(now time.Time) time.Duration {
	if !lv.Alive() || lv.Launch == nil {
		return 0
	}
	return now.Sub(lv.Launch.StartedAt).Truncate(time.Second)
}

// Inspect reads the VM's state. A PID that now belongs to another process
// is not this VM (it is never signalled either). An unreadable launch.json
// (torn by a host crash, say) is no dead end: QEMU is then looked for
// through its pid file and the process table, and QMP as usual.
func (l *Launcher) Inspect(ctx context.Context, m Machine) (Live, error) {
	launch, err := readLaunch(m.runFile(LaunchFile))
	if errors.Is(err, os.ErrNotExist) {
		if hasSavedState(m) {
			return suspendedLive(m, nil), nil
		}
		return Live{State: driver.StateStopped}, nil
	}
	live := Live{Launch: launch, LaunchErr: err}
	// QEMU's own pid file first, then what the start recorded; the
	// process table when launch.json cannot say.
	match := m.isQEMU()
	pid, _ := proc.ReadPid(m.runFile(PidFile))
	ok := proc.Verified(pid, match) // each check reads the process's /proc files: once per pid
	if !ok && launch != nil {
		pid = launch.QEMUPid
		ok = proc.Verified(pid, match)
	}
	if !ok && live.LaunchErr != nil {
		pid = proc.Find(match)
		ok = proc.Verified(pid, match)
	}
	if !ok {
		if hasSavedState(m) {
			return suspendedLive(m, launch), nil
		}
		live.State = driver.StateCrashed
		switch {
		case exists(m.runFile(CleanMarker)):
			live.State = driver.StateStopped
		case strings.Contains(driver.TailFile(m.ConsoleLogPath(), 3), driver.PowerOffMarker):
			live.State, live.Detail = driver.StateStopped, "the guest powered itself off"
		default:
			live.Detail = "QEMU is gone without a clean shutdown; " + crashHint(m)
		}
		live.Detail = withLaunchErr(live.Detail, live.LaunchErr)
		return live, nil
	}
	live.Pid, live.State = pid, driver.StateRunning
	live.Detail, live.QMPStatus = l.qmpStatus(ctx, m)
	switch live.QMPStatus {
	case "paused", "":
		// Paused by a suspend in place (pause.go), or by something else;
		// one whose QMP does not answer may be either.
		if !pausedLive(m, &live, pid) && live.QMPStatus == "paused" {
			live.State = driver.StatePaused
		}
	case "suspended", "prelaunch", "inmigrate", "postmigrate", "save-vm", "restore-vm", "finish-migrate":
		live.State = driver.StatePaused
	case "shutdown", "guest-panicked", "internal-error", "io-error":
		live.Detail = "QEMU reports " + live.QMPStatus
	}
	live.Detail = withLaunchErr(live.Detail, live.LaunchErr)
	return live, nil
}

// suspendedLive is the state of a VM with a saved state and no QEMU.
func suspendedLive(m Machine, launch *Launch) Live {
	lv := Live{State: driver.StateSuspended, Suspend: driver.SuspendSaved, Launch: launch}
	s, err := readSavedState(m)
	if err != nil {
		lv.Detail = "its saved state's record is unreadable: " + err.Error()
		return lv
	}
	lv.Detail = fmt.Sprintf("saved to disk %s, %d MiB", s.SavedAt.Local().Format(time.DateTime), s.Bytes>>20)
	return lv
}

// qmpStatus asks QEMU for its run state; detail says why it did not answer.
func (l *Launcher) qmpStatus(ctx context.Context, m Machine) (detail, status string) {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := qmp.Dial(qctx, m.QMPPath())
	if err != nil {
		return "QMP did not answer (another agent-vm command may be using it)", ""
	}
	defer c.Close()
	st, err := c.Status(qctx)
	if err != nil {
		return "QMP did not answer: " + err.Error(), ""
	}
	return "", st
}

// withLaunchErr adds to a detail that launch.json is unreadable.
func withLaunchErr(detail string, err error) string {
	if err == nil {
		return detail
	}
	msg := fmt.Sprintf("unreadable run file: %v (accelerator, share and uptime unknown; the next start writes it anew)", err)
	if detail == "" {
		return msg
	}
	return detail + "; " + msg
}

func crashHint(m Machine) string {
	return fmt.Sprintf("see %s and %s", m.ConsoleLogPath(), m.QEMULogPath())
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Stop shuts the VM down: ACPI power-off (the guest shuts down cleanly),
// then QMP quit, then SIGKILL, each only if the previous did not end QEMU
// within its time. Only a PID proven to be this VM's QEMU is ever signalled.
// virtiofsd is stopped after QEMU, and a clean-shutdown marker is written.
// A VM paused in place is continued first, so that its guest can answer
// the power-off; a saved state is discarded.
func (l *Launcher) Stop(ctx context.Context, m Machine, grace time.Duration) error {
	live, err := l.Inspect(ctx, m)
	if err != nil {
		return err
	}
	vfs := 0
	if live.Launch != nil {
		vfs = live.Launch.VirtiofsdPid
	} else {
		// No launch.json to say (unreadable, or a start killed before it
		// wrote one): the process table knows.
		vfs = proc.Find(virtiofsd.Serving(m.sockFile(VirtiofsdSock)))
	}
	switch {
	case live.InPlace():
		// Paused in place: its guest can power off once its CPUs run
		// again (a hibernated one's memory back first). If they do not,
		// quit and SIGKILL below end it.
		if p := readPause(m); p != nil && p.Memory {
			if err := l.restoreMemory(m, p); err != nil {
				l.Log.Warn("stopping a hibernated VM without its guest's shutdown", "vm", m.Name, "error", err)
				grace = 0
				break
			}
		}
		if !l.qmpCommand(ctx, m, "cont") {
			grace = 0
		}
	case live.State == driver.StateSuspended:
		// Stopping a suspended VM discards its saved state: it boots
		// cold next time.
		if err := discardSavedState(m); err != nil {
			return fmt.Errorf("discarding the saved state of %s: %w", m.Name, err)
		}
		return l.finishStop(m, 0)
	case !live.Alive():
		// Nothing to stop; clear what a crash left (a crashed VM that was
		// stopped reads as stopped from now on).
		l.stopVirtiofsd(m, vfs, 0)
		l.stopStrayVirtiofsds(m)
		l.stopEgress(m)
		if live.Launch != nil || live.LaunchErr != nil {
			_ = l.finishStop(m, 0)
		}
		return driver.ErrNotRunning
	}
	match := m.isQEMU()
	log := l.Log.With("vm", m.Name, "pid", live.Pid)
	if l.qmpCommand(ctx, m, "system_powerdown") {
		log.Debug("asked the guest to power off")
		if proc.WaitGoneCtx(ctx, live.Pid, match, grace) {
			return l.finishStop(m, vfs)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Warn("the guest did not power off in time; quitting QEMU", "waited", grace)
	}
	if l.qmpCommand(ctx, m, "quit") && proc.WaitGoneCtx(ctx, live.Pid, match, 5*time.Second) {
		return l.finishStop(m, vfs)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	log.Warn("QEMU did not quit; killing it")
	proc.Kill(live.Pid, match)
	if proc.Verified(live.Pid, match) {
		return fmt.Errorf("QEMU (pid %d) of %s survived SIGKILL", live.Pid, m.Name)
	}
	return l.finishStop(m, vfs)
}

func (l *Launcher) finishStop(m Machine, vfs int) error {
	l.stopVirtiofsd(m, vfs, 3*time.Second)
	l.cleanup(m)
	return os.WriteFile(m.runFile(CleanMarker), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600)
}

// cleanup removes the pid file and sockets of a VM that no longer runs,
// and the socket directory itself when it lives outside the run directory
// (SocketDirFor): the next start makes it again, and a VM that never gets
// a destroy (a template's, saved and kept) leaves none behind. Only an
// empty one goes.
func (l *Launcher) cleanup(m Machine) {
	_ = os.Remove(m.runFile(PidFile))
	_ = os.Remove(m.QMPPath())
	_ = os.Remove(m.sockFile(VirtiofsdSock))
	_ = os.Remove(m.runFile(PauseFile))
	_ = os.Remove(m.runFile(MemoryFile))
	l.stopEgress(m)
	if dir := m.socketDir(); dir != m.RunDir {
		_ = os.Remove(dir)
	}
}

// qmpCommand runs a command that takes no arguments and reports whether QEMU
// accepted it.
func (l *Launcher) qmpCommand(ctx context.Context, m Machine, cmd string) bool {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := qmp.Dial(qctx, m.QMPPath())
	if err != nil {
		l.Log.Debug("qmp unavailable", "command", cmd, "error", err)
		return false
	}
	defer c.Close()
	if _, err := c.Execute(qctx, cmd, nil); err != nil {
		l.Log.Debug("qmp command failed", "command", cmd, "error", err)
		return false
	}
	return true
}
