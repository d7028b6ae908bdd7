package qemu

// Pause in place.
//
// A VM paused in place is a QEMU whose CPUs QMP `stop` stopped: no guest
// code runs, so it uses no guest CPU, but its process keeps running with
// the guest's memory (host RAM) and every device. The workspace's
// virtiofs device, which a save must unplug (see suspend.go), stays, and
// with it the guest's mount and every process using it; virtiofsd and the
// egress proxy keep running. `cont` continues it where it was, the same
// process. internal/vm pauses a VM whose workspace is in use instead of
// saving it.
//
// What tells a pause by agent-vm from a QEMU paused otherwise (a failed
// migration leaves it paused too) is PauseFile in the run directory, which
// names the pid of the QEMU it paused: Inspect reads a paused QEMU with a
// PauseFile of its pid as StateSuspended (SuspendPaused), any other as
// StatePaused. Stop continues a paused VM before its ACPI power-off, so
// that its guest shuts down cleanly, and removes the file; so does a
// start, after a paused QEMU died (a host reboot: the VM reads crashed).
//
// Hibernate pauses the same way and then moves the guest's memory to
// MemoryFile in the run directory (package guestram): the QEMU keeps its
// devices and its own memory, the host gets the guest's back. The mark
// names the file only once it is whole on disk, and before the memory is
// given up; from then on nothing runs the CPUs (Continue, Stop) before the
// memory is back. A QEMU that dies hibernated takes its guest's memory
// with it, as one paused in place does: the file goes with the mark.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestram"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qmp"
)

// PauseFile marks a VM paused in place (pauseMark).
const PauseFile = "paused.json"

// MemoryFile holds a hibernated VM's guest memory.
const MemoryFile = "memory.ram"

// pauseMark is PauseFile's content.
type pauseMark struct {
	QEMUPid  int       `json:"qemu_pid"`
	PausedAt time.Time `json:"paused_at"`
	// Memory is set once the guest's memory is in MemoryFile (Hibernate),
	// MemoryBytes of data.
	Memory      bool  `json:"memory_on_disk,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
}

// readPause reads m's pause mark; nil when there is none (or it cannot be
// read: then the pause is not agent-vm's as far as Inspect can tell).
func readPause(m Machine) *pauseMark {
	b, err := os.ReadFile(m.runFile(PauseFile))
	if err != nil {
		return nil
	}
	var p pauseMark
	if json.Unmarshal(b, &p) != nil || p.QEMUPid <= 0 {
		return nil
	}
	return &p
}

// Pause stops the running VM's CPUs in place and marks it paused (see
// above). A VM that is not running is ErrNotRunning; one whose mark cannot
// be written is continued again.
func (l *Launcher) Pause(ctx context.Context, m Machine) error {
	live, err := l.Inspect(ctx, m)
	if err != nil {
		return err
	}
	if live.State != driver.StateRunning {
		return fmt.Errorf("pausing %s: it is %s: %w", m.Name, live.State, driver.ErrNotRunning)
	}
	c, err := l.dialQMP(ctx, m)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Execute(ctx, "stop", nil); err != nil {
		return fmt.Errorf("pausing %s: %w", m.Name, err)
	}
	if err := writeJSON(m.runFile(PauseFile), pauseMark{QEMUPid: live.Pid, PausedAt: time.Now().UTC()}); err != nil {
		if _, cerr := c.Execute(context.Background(), "cont", nil); cerr != nil {
			return fmt.Errorf("pausing %s: %w; continuing it failed too: %v (hint: `agent-vm restart BRANCH`)", m.Name, err, cerr)
		}
		return fmt.Errorf("pausing %s: %w (the VM runs on)", m.Name, err)
	}
	l.Log.Debug("paused in place", "vm", m.Name, "pid", live.Pid)
	return nil
}

// Hibernate pauses the running VM in place (Pause) and moves its guest's
// memory to MemoryFile. Memory that cannot be moved (a QEMU whose RAM is
// not agent-vm's memfd: driver.ErrUnsupported; a disk that fills) leaves
// the VM continued, as it was.
func (l *Launcher) Hibernate(ctx context.Context, m Machine) error {
	if err := l.Pause(ctx, m); err != nil {
		return err
	}
	err := l.moveMemory(m)
	if err == nil {
		return nil
	}
	if _, cerr := l.Continue(context.Background(), m); cerr != nil {
		return fmt.Errorf("hibernating %s: %w; continuing it failed too: %v (hint: `agent-vm resume %s`)", m.Name, err, cerr, strings.TrimPrefix(m.Name, "agent-vm-"))
	}
	return fmt.Errorf("hibernating %s: %w (the VM runs on)", m.Name, err)
}

// moveMemory moves a paused VM's guest memory to MemoryFile and marks it.
func (l *Launcher) moveMemory(m Machine) error {
	p := readPause(m)
	if p == nil {
		return fmt.Errorf("its pause mark is gone")
	}
	mem, err := guestram.Open(p.QEMUPid, int64(m.MemoryMiB)<<20)
	if err != nil {
		return fmt.Errorf("%w: %w", err, driver.ErrUnsupported)
	}
	defer mem.Close()
	began := time.Now()
	n, err := guestram.Save(mem, m.runFile(MemoryFile))
	if err != nil {
		return err
	}
	p.Memory, p.MemoryBytes = true, n
	if err := writeJSON(m.runFile(PauseFile), p); err != nil {
		_ = os.Remove(m.runFile(MemoryFile))
		return err
	}
	if err := guestram.Release(mem); err != nil {
		// The memory is whole in the file and in QEMU: Continue writes it
		// back over itself.
		return err
	}
	l.Log.Debug("hibernated", "vm", m.Name, "memory_mib", n>>20, "took", time.Since(began))
	return nil
}

// Hibernated reports whether the VM whose run directory is runDir is
// hibernated: its mark says its memory is on disk and the QEMU it names
// still runs (a VM's holder asks, see internal/idle).
func Hibernated(runDir string) bool {
	p := readPause(Machine{Machine: driver.Machine{RunDir: runDir}})
	return p != nil && p.Memory && proc.Args(p.QEMUPid) != nil
}

// restoreMemory writes a hibernated VM's memory back into its QEMU; the
// file stays until the VM runs again (Continue removes it).
func (l *Launcher) restoreMemory(m Machine, p *pauseMark) error {
	mem, err := guestram.Open(p.QEMUPid, int64(m.MemoryMiB)<<20)
	if err == nil {
		err = guestram.Restore(mem, m.runFile(MemoryFile))
		mem.Close()
	}
	if err != nil {
		return fmt.Errorf("bringing back the memory of hibernated %s: %w (its CPUs stay stopped; hint: `agent-vm stop %s` ends its QEMU without running it, losing what ran in it)", m.Name, err, strings.TrimPrefix(m.Name, "agent-vm-"))
	}
	return nil
}

// Continue runs the CPUs of a VM Pause or Hibernate paused again (a
// hibernated one's memory brought back first) and removes its mark; it
// returns the launch of its QEMU, the same process.
func (l *Launcher) Continue(ctx context.Context, m Machine) (*Launch, error) {
	live, err := l.Inspect(ctx, m)
	if err != nil {
		return nil, err
	}
	if !live.InPlace() {
		return nil, fmt.Errorf("continuing %s: it is %s, not paused in place: %w", m.Name, live.State, driver.ErrNotRunning)
	}
	if p := readPause(m); p != nil && p.Memory {
		if err := l.restoreMemory(m, p); err != nil {
			return nil, err
		}
	}
	c, err := l.dialQMP(ctx, m)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := c.Execute(ctx, "cont", nil); err != nil {
		return nil, fmt.Errorf("continuing %s: %w", m.Name, err)
	}
	if err := os.Remove(m.runFile(PauseFile)); err != nil && !os.IsNotExist(err) {
		l.Log.Warn("could not remove the pause mark of a continued VM", "vm", m.Name, "error", err)
	}
	_ = os.Remove(m.runFile(MemoryFile))
	launch := live.Launch
	if launch == nil { // an unreadable launch.json: what the process table says
		launch = &Launch{QEMUPid: live.Pid}
	}
	return launch, nil
}

// dialQMP connects to m's QMP socket, within suspendQMPTimout.
func (l *Launcher) dialQMP(ctx context.Context, m Machine) (*qmp.Client, error) {
	qctx, cancel := context.WithTimeout(ctx, suspendQMPTimout)
	defer cancel()
	c, err := qmp.Dial(qctx, m.QMPPath())
	if err != nil {
		return nil, fmt.Errorf("reaching %s's QEMU over QMP: %w (hint: another agent-vm command may be using it; try again)", m.Name, err)
	}
	return c, nil
}

// pausedLive makes live, QEMU of pid found paused (or not answering on
// QMP), a VM suspended in place when its pause mark names pid; ok is false
// when it is not agent-vm's pause.
func pausedLive(m Machine, live *Live, pid int) (ok bool) {
	p := readPause(m)
	if p == nil || p.QEMUPid != pid {
		return false
	}
	live.State, live.Suspend = driver.StateSuspended, driver.SuspendPaused
	how := "paused in place"
	if p.Memory {
		live.Suspend, how = driver.SuspendHibernated, fmt.Sprintf("hibernated (its memory, %d MiB, in a file on disk; a connection to the VM wakes it)", p.MemoryBytes>>20)
	}
	ram := ""
	if n, ok := proc.ResidentBytes(pid); ok {
		live.Resident = n
		ram = fmt.Sprintf("; its QEMU holds %d MiB of host RAM", n>>20)
	}
	why := ""
	if live.Detail != "" { // QMP did not answer
		why = " (" + live.Detail + ")"
	}
	live.Detail = fmt.Sprintf("%s since %s%s: no guest code runs, the workspace stays mounted%s; `agent-vm resume %s` continues it",
		how, p.PausedAt.Local().Format(time.DateTime), why, ram, strings.TrimPrefix(m.Name, "agent-vm-"))
	return true
}
