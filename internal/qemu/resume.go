package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestram"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qmp"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// Resume starts the VM from its saved state (see suspend.go) and returns
// once the guest runs again with its share plugged in. A state that does
// not fit is refused before anything starts (ErrStaleState); a resume that
// fails after QEMU started ends what it started and keeps the state, so
// the VM is suspended as before.
func (l *Launcher) Resume(ctx context.Context, m Machine, b Boot, o StartOptions) (*Launch, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	s, err := readSavedState(m)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s has no saved state to resume: %w", m.Name, driver.ErrNotRunning)
	}
	if err != nil {
		return nil, staleError(m, "its record is unreadable: "+err.Error())
	}
	if b.Direct == nil {
		return nil, fmt.Errorf("resuming %s: a run script's machine cannot be resumed: %w", m.Name, driver.ErrUnsupported)
	}
	if s.Share == driver.ShareVirtiofs && o.Virtiofsd == nil {
		return nil, fmt.Errorf("resuming %s: its workspace was shared over virtiofs, and virtiofsd is not found now (hint: install it, or `agent-vm start --cold BRANCH` to discard the saved state)", m.Name)
	}
	version, err := qemuVersion(ctx, l.Run, l.Arch.Binary)
	if err != nil {
		return nil, err
	}
	h := l.hardening(m, b)
	key := machineKey(ResumeArgv(l.Arch, m, b.Direct, o.Accel, s.Share, h))
	if err := checkSavedState(s, version, key, writableDisks(DirectArgv(l.Arch, m, b.Direct, o.Accel, s.Share, h))); err != nil {
		return nil, staleError(m, err.Error())
	}
	o.resume, o.share = true, s.Share
	launch, err := l.start(ctx, m, b, o)
	if err != nil {
		return nil, err
	}
	if err := l.restore(ctx, m, s, m, o.Virtiofsd, launch, nil); err != nil {
		proc.Kill(launch.QEMUPid, m.isQEMU())
		l.stopStrayVirtiofsds(m)
		l.cleanup(m)
		_ = os.Remove(m.runFile(LaunchFile))
		return nil, fmt.Errorf("resuming %s: %w (the saved state is kept)", m.Name, err)
	}
	if err := discardSavedState(m); err != nil {
		l.Log.Warn("could not remove the loaded state", "error", err)
	}
	return launch, nil
}

// restore loads the state saved in from's run directory (m's own for a
// resume, a template's for a clone) into m's waiting QEMU, makes the
// memory edits (a clone's), runs the guest and plugs the share in again;
// launch.json then says the share's virtiofsd.
func (l *Launcher) restore(ctx context.Context, m Machine, s *savedState, from Machine, v *virtiofsd.Binary, launch *Launch, edits []driver.MemoryEdit) error {
	qctx, cancel := context.WithTimeout(ctx, suspendQMPTimout)
	c, err := qmp.Dial(qctx, m.QMPPath())
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Version != s.QEMU {
		return fmt.Errorf("QEMU says it is %s, the state was saved by %s: %w", c.Version, s.QEMU, driver.ErrStaleState)
	}
	began := time.Now()
	if s.RAMApart {
		if err := l.restoreRAM(ctx, c, m, launch.QEMUPid, from.runFile(RAMFile)); err != nil {
			return err
		}
		l.Log.Debug("wrote the guest's RAM back", "vm", m.Name, "took", time.Since(began))
	}
	stateFile := from.runFile(StateFile)
	f, err := os.Open(stateFile)
	if err != nil {
		return fmt.Errorf("opening the saved state: %w", err)
	}
	defer f.Close()
	dropped, err := loadState(ctx, c, f, !s.RAMApart)
	if err != nil {
		return fmt.Errorf("loading the saved state: %w; QEMU's log %s says: %s", err, m.QEMULogPath(), orNothing(driver.TailFile(m.QEMULogPath(), 3)))
	}
	l.Log.Debug("loaded the saved state", "vm", m.Name, "took", time.Since(began), "zero_pages_left_out", dropped)
	if len(edits) > 0 {
		if err := editMemory(ctx, c, edits); err != nil {
			return fmt.Errorf("%w: %w", err, driver.ErrStaleState)
		}
		l.Log.Debug("edited the restored memory", "vm", m.Name, "edits", len(edits))
	}
	if _, err := c.Execute(ctx, "cont", nil); err != nil {
		return err
	}
	if s.Share != driver.ShareVirtiofs {
		return nil
	}
	began = time.Now()
	pid, err := l.plugVirtiofs(ctx, c, m, v)
	if err != nil {
		return err
	}
	l.Log.Debug("plugged the share in", "vm", m.Name, "took", time.Since(began))
	launch.VirtiofsdPid = pid
	return l.recordVirtiofsd(m, pid)
}

// restoreRAM writes the guest's RAM, saved apart in file, into the
// waiting QEMU's fresh memfd and has the load that follows leave it be
// (x-ignore-shared, as the save had it). Only the file's data is written:
// the rest of a fresh memfd reads as zeros, as it did in the saved guest,
// and is not allocated until the guest uses it.
func (l *Launcher) restoreRAM(ctx context.Context, c *qmp.Client, m Machine, pid int, file string) error {
	if err := setIgnoreShared(ctx, c, true); err != nil {
		return err
	}
	mem, err := guestram.Open(pid, int64(m.MemoryMiB)<<20)
	if err != nil {
		return err
	}
	defer mem.Close()
	return guestram.Restore(mem, file)
}

// loadState has QEMU load the stream in f. Where it may hold the guest's RAM
// (zeroPages: saved without RAMFile), QEMU reads it through a pipe, less
// the RAM's zero pages (copyWithoutZeroPages says why); it returns how
// many it left out.
func loadState(ctx context.Context, c *qmp.Client, f *os.File, zeroPages bool) (int64, error) {
	if !zeroPages {
		if err := c.SendFD(ctx, "agentvm-state", f); err != nil {
			return 0, err
		}
		if _, err := c.Execute(ctx, "migrate-incoming", map[string]string{"uri": "fd:agentvm-state"}); err != nil {
			return 0, err
		}
		return 0, waitMigration(ctx, c)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	err = c.SendFD(ctx, "agentvm-state", pr)
	pr.Close()
	if err != nil {
		pw.Close()
		return 0, err
	}
	type copied struct {
		dropped int64
		err     error
	}
	done := make(chan copied, 1)
	go func() {
		n, err := copyWithoutZeroPages(pw, f, guestRAM)
		pw.Close()
		done <- copied{n, err}
	}()
	// QEMU's end of the pipe may close before the copy ends (a failed
	// load): closing ours ends a write that waits on it.
	finish := func() copied { pw.Close(); return <-done }
	if _, err := c.Execute(ctx, "migrate-incoming", map[string]string{"uri": "fd:agentvm-state"}); err != nil {
		finish()
		return 0, err
	}
	err = waitMigration(ctx, c)
	res := finish()
	if err != nil && res.err != nil {
		err = fmt.Errorf("%w (reading %s: %w)", err, f.Name(), res.err)
	}
	return res.dropped, err
}

// plugVirtiofs starts a virtiofsd for the share, connects to it and hands
// QEMU the connection (QEMU, under -runas, cannot reach the socket), then
// plugs the device into its slot. It returns virtiofsd's pid.
func (l *Launcher) plugVirtiofs(ctx context.Context, c *qmp.Client, m Machine, v *virtiofsd.Binary) (int, error) {
	if v == nil {
		return 0, errors.New("internal error: no virtiofsd to serve the workspace")
	}
	pid, err := l.startVirtiofsd(ctx, v, m)
	if err != nil {
		return 0, err
	}
	fail := func(err error) (int, error) {
		l.stopVirtiofsd(m, pid, 0)
		return 0, fmt.Errorf("plugging the workspace in: %w", err)
	}
	conn, err := net.Dial("unix", m.sockFile(VirtiofsdSock))
	if err != nil {
		return fail(err)
	}
	f, err := conn.(*net.UnixConn).File()
	conn.Close()
	if err != nil {
		return fail(err)
	}
	err = c.SendFD(ctx, "agentvm-fs-conn", f)
	f.Close()
	if err != nil {
		return fail(err)
	}
	_, _ = c.Execute(ctx, "chardev-remove", map[string]string{"id": ShareChardev}) // one a failed unplug left
	chardev := map[string]any{"id": ShareChardev, "backend": map[string]any{"type": "socket", "data": map[string]any{
		"server": false, "addr": map[string]any{"type": "fd", "data": map[string]string{"str": "agentvm-fs-conn"}}}}}
	if _, err := c.Execute(ctx, "chardev-add", chardev); err != nil {
		return fail(err)
	}
	dev := map[string]string{"driver": "vhost-user-fs-pci", "chardev": ShareChardev, "tag": m.Share.Tag, "id": ShareDevice, "bus": ShareSlot}
	if _, err := c.Execute(ctx, "device_add", dev); err != nil {
		_, _ = c.Execute(ctx, "chardev-remove", map[string]string{"id": ShareChardev})
		return fail(err)
	}
	return pid, nil
}

// recordVirtiofsd notes the share's new virtiofsd in launch.json (Stop
// ends it from there).
func (l *Launcher) recordVirtiofsd(m Machine, pid int) error {
	launch, err := readLaunch(m.runFile(LaunchFile))
	if err != nil {
		return err
	}
	launch.VirtiofsdPid, launch.Share = pid, driver.ShareVirtiofs
	return writeJSON(m.runFile(LaunchFile), launch)
}
