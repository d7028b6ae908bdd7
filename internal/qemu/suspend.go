package qemu

// Suspend and resume.
//
// A suspended VM is a file: its memory and device state, saved by QEMU's
// migration to a file in the VM's run directory, with no process left. It
// costs disk (about the guest's used memory), not CPU or RAM.
//
// Suspend, in order:
//
//  1. The host side checks that it can: QEMU runs this VM, its command line
//     has the hot-pluggable slot for the share (ShareSlot: Direct boots of
//     this agent-vm; a Script boot, NixOS, has none and is refused).
//  2. The guest side (GuestHooks.Detach, run over SSH by internal/vm):
//     stop agent-mcp (its working directory is /workspace), sync, unmount
//     /workspace. A process with its cwd or an open file there makes the
//     unmount fail: the suspend is refused, naming those processes. The
//     share cannot be saved while mounted: vhost-user-fs (virtiofs) blocks
//     migration in QEMU 7.2 whatever the guest does, and 9p while mounted.
//  3. virtiofs: QMP device_del of the vhost-user-fs-pci device (it sits on
//     its own pcie-root-port, since nothing on the root bus of q35 can be
//     unplugged), wait for DEVICE_DELETED (the guest ejects it), then
//     chardev-remove its socket, which ends virtiofsd. 9p: nothing; its
//     device has no open fid once unmounted and is saved with the rest.
//  4. QMP stop (the CPUs). The guest's RAM is saved apart (RAMFile): its
//     memfd's data copied at its offsets, holes and blocks of zeros left
//     as holes (internal/guestram, as hibernation does), and the migration
//     told to leave it out (x-ignore-shared, which before QEMU 8.1 ignores
//     every shared RAM block). A migration that carries the RAM reads
//     every page of it to tell zero pages, and reading a page of a memfd
//     the guest never used allocates it: a save of a 4 GiB guest that used
//     600 MiB made its QEMU hold 4.2 GiB and took 22 s under TCG, where
//     the copy of the data takes about half a second. Where agent-vm
//     cannot open the memfd, or QEMU is 8.1 or newer, the RAM goes into
//     the stream as before. Then migrate to "fd:": QEMU 7.2 has no "file:"
//     URI (8.2 does), and "exec:cat > file" would run cat as QEMU's -runas
//     user, who cannot write the root-owned run directory. agent-vm opens
//     the file itself (0600, O_EXCL) and hands QEMU the descriptor with
//     getfd (SCM_RIGHTS on the QMP socket).
//     At its end QEMU inactivates the disks (hands them to the receiving
//     side); with auto-read-only it would reopen each by its path, which
//     QEMU under -runas cannot, so writable disks are opened with
//     file.auto-read-only=off (diskArgs).
//  5. Once the migration completes: fsync and rename the state into place,
//     QMP quit, end the egress proxy, and write the record
//     (suspend.json: QEMU's version from its QMP greeting, the hash of the
//     machine's command line without its host plumbing, and the identity
//     of its writable disks), the last step: a state without its record is
//     no suspended VM and a cold start removes it.
//
// Any failure after step 2 puts things back (device and share plugged in
// again, CPUs running, GuestHooks.Attach) and reports the failure.
//
// Resume starts QEMU as Start does (egress proxy and its guestfwd rules,
// which live as long as one QEMU process, included), from the same plan,
// but without the virtiofs device and with -incoming defer -S; it refuses
// first when the QEMU version, the machine's command line or a writable
// disk differs from the record (ErrStaleState; `start --cold` discards the
// state). A RAM saved apart is written into the new QEMU's fresh memfd
// (its data only) and x-ignore-shared set as the save had it. Then getfd
// + migrate-incoming "fd:", wait for the load, cont;
// virtiofs: a new virtiofsd, connected by agent-vm and handed to QEMU
// (chardev-add of an fd socket: QEMU, having dropped to the workspace's
// owner, cannot connect to a socket in the run directory itself), and
// device_add on the slot. The state and its record are removed once the
// guest runs. The caller (internal/vm) then waits for SSH, sets the guest's
// clock from the host's (a restored guest keeps the time it was saved at;
// `date -s` over SSH needs no guest agent), mounts /workspace again and
// starts agent-mcp.
//
// What a save does not keep: processes using /workspace (an agent
// session's shell in tmux has its cwd there; so has `agent-vm shell`). It
// refuses; internal/vm then pauses the VM in place instead (pause.go),
// which keeps them at the cost of the host RAM its QEMU holds. Saving them
// would take one of:
//   - a guest-side layer between them and the share (an overlay or FUSE
//     passthrough whose lower half is unmounted and remounted while the
//     upper keeps its inodes): guest software of agent-vm's own, and the
//     page cache of files open across a suspend may go stale;
//   - NFS over a guestfwd rule with hard mounts: the client retries while
//     the server is away and resumes with the same handles, at NFS's cost
//     for many small files (bench's P6b) and a host NFS server per VM;
//   - QEMU >= 8.2 with the Rust virtiofsd (>= 1.9, --migration-mode), which
//     migrate the virtiofs device with the rest: no unmount at all. Debian
//     12 has QEMU 7.2 and the C virtiofsd; NixOS hosts have both, so this
//     is the path there, with the unmount kept as the fallback.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestram"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qmp"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// Time limits of a suspend's and a resume's steps (TCG guests are slow to
// eject a device; a migration writes the guest's memory).
const (
	unplugTimeout    = 60 * time.Second
	migrateTimeout   = 5 * time.Minute
	suspendQMPTimout = 10 * time.Second
)

// Suspend saves the running VM to its run directory and ends its QEMU (see
// above). The VM is left running, with its share mounted, when it fails.
// v is the virtiofsd that serves the share again if the suspend must be
// undone after the share was unplugged.
func (l *Launcher) Suspend(ctx context.Context, m Machine, g driver.GuestHooks, v *virtiofsd.Binary) error {
	began := time.Now()
	live, err := l.Inspect(ctx, m)
	if err != nil {
		return err
	}
	switch {
	case live.State == driver.StateSuspended:
		return fmt.Errorf("%s is suspended already", m.Name)
	case !live.Alive():
		return fmt.Errorf("%s is %s: %w", m.Name, live.State, driver.ErrNotRunning)
	case live.Launch == nil:
		return fmt.Errorf("%s runs without a readable launch record (%v), so agent-vm cannot tell how its workspace is shared (hint: restart it)", m.Name, live.LaunchErr)
	}
	args := proc.Args(live.Pid)
	if !slices.Contains(argValues(args, "-device"), shareSlotArgs()[1]) {
		return fmt.Errorf("%s cannot be suspended: its QEMU has no hot-pluggable slot for the workspace (a NixOS VM, or one started by an agent-vm from before suspend): %w (hint: `agent-vm restart BRANCH` starts a Debian VM with one)", m.Name, driver.ErrUnsupported)
	}
	c, err := l.dialQMP(ctx, m)
	if err != nil {
		return err
	}
	defer c.Close()
	s := &suspension{l: l, m: m, c: c, v: v, launch: live.Launch, pid: live.Pid, args: args}
	if err := g.Detach(ctx); err != nil {
		return err
	}
	if err := s.save(ctx); err != nil {
		if rerr := s.rollback(g); rerr != nil {
			return fmt.Errorf("suspending %s: %w; putting it back failed too: %v (hint: `agent-vm restart BRANCH`)", m.Name, err, rerr)
		}
		return fmt.Errorf("suspending %s: %w (the VM runs on as before)", m.Name, err)
	}
	l.Log.Debug("suspended", "vm", m.Name, "took", time.Since(began))
	return nil
}

// suspension is one suspend under way, for its steps and their undoing.
type suspension struct {
	l      *Launcher
	m      Machine
	c      *qmp.Client
	v      *virtiofsd.Binary
	launch *Launch
	pid    int
	args   []string
	// What has been done that rollback undoes.
	unplugged, stopped bool
	// ramApart: the guest's RAM is in RAMFile, not in the stream.
	ramApart bool
}

// saveRAM saves the stopped guest's RAM to RAMFile, apart from the
// stream, and has the migration leave it out (x-ignore-shared), where it
// can: the QEMU ignores a shared memfd (ramApartIn) and agent-vm can open
// it (guestram.Open: the rights hibernation needs). Otherwise the RAM
// goes into the stream as before, and saveRAM returns 0. It returns the
// bytes of RAM saved.
func (s *suspension) saveRAM(ctx context.Context) (int64, error) {
	if !ramApartIn(s.c.Version) {
		return 0, nil
	}
	mem, err := guestram.Open(s.pid, int64(s.m.MemoryMiB)<<20)
	if err != nil {
		s.l.Log.Debug("the guest's RAM goes into the stream", "vm", s.m.Name, "reason", err)
		return 0, nil
	}
	defer mem.Close()
	if err := setIgnoreShared(ctx, s.c, true); err != nil {
		return 0, err
	}
	s.ramApart = true
	n, err := guestram.Save(mem, s.m.runFile(RAMFile))
	if err != nil {
		return 0, err
	}
	return n, nil
}

// setIgnoreShared sets the migration capability x-ignore-shared, which
// leaves the guest's shared RAM out of the stream (both ends must agree).
func setIgnoreShared(ctx context.Context, c *qmp.Client, on bool) error {
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": on}}}
	if _, err := c.Execute(ctx, "migrate-set-capabilities", caps); err != nil {
		return fmt.Errorf("setting the migration's x-ignore-shared to %v: %w", on, err)
	}
	return nil
}

// ramApartIn says whether QEMU of this version (its QMP greeting's, as
// "7.2.22") leaves the guest's RAM, a shared memfd, out of the stream
// with x-ignore-shared. From 8.1 the capability ignores shared blocks
// backed by a named file only (ramblock_is_ignored), so a memfd's pages
// would be in the stream as well as in RAMFile.
func ramApartIn(version string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < 8 || major == 8 && minor < 1
}

// save unplugs the share, saves the state and ends QEMU.
func (s *suspension) save(ctx context.Context) error {
	began := time.Now()
	if s.launch.Share == driver.ShareVirtiofs {
		if err := s.unplug(ctx); err != nil {
			return err
		}
		s.l.Log.Debug("unplugged the workspace device", "vm", s.m.Name, "took", time.Since(began))
	}
	if _, err := s.c.Execute(ctx, "stop", nil); err != nil {
		return err
	}
	s.stopped = true
	saving := time.Now()
	ram, err := s.saveRAM(ctx)
	if err != nil {
		return err
	}
	bytes, err := s.migrate(ctx)
	if err != nil {
		return err
	}
	s.l.Log.Debug("saved the state", "vm", s.m.Name, "bytes", bytes, "ram_apart", s.ramApart, "ram_bytes", ram, "took", time.Since(saving))
	bytes += ram
	// Past here the state is complete: QEMU goes whatever happens.
	_, _ = s.c.Execute(ctx, "quit", nil)
	if !proc.WaitGoneCtx(ctx, s.pid, s.m.isQEMU(), 10*time.Second) {
		proc.Kill(s.pid, s.m.isQEMU())
	}
	s.l.stopVirtiofsd(s.m, s.launch.VirtiofsdPid, 0)
	s.l.cleanup(s.m)
	disks, err := diskIDs(writableDisks(s.args))
	if err != nil {
		_ = discardSavedState(s.m)
		return fmt.Errorf("the state was saved but its disk cannot be read, so it was discarded (the VM is stopped; `agent-vm start` boots it): %w", err)
	}
	key := machineKey(s.args[1:]) // without the binary
	rec := savedState{Version: savedStateVersion, QEMU: s.c.Version, Machine: hashArgs(key), MachineArgs: key,
		Disks: disks, Share: s.launch.Share, Accel: s.launch.Accel, SavedAt: time.Now().UTC(), Bytes: bytes, RAMApart: s.ramApart}
	return writeJSON(s.m.runFile(StateMeta), rec)
}

// unplug removes the virtiofs device and its socket; virtiofsd ends.
func (s *suspension) unplug(ctx context.Context) error {
	if _, err := s.c.Execute(ctx, "device_del", map[string]string{"id": ShareDevice}); err != nil {
		return fmt.Errorf("unplugging the workspace device: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, unplugTimeout)
	defer cancel()
	for {
		ev, err := s.c.WaitEvent(wctx, "DEVICE_DELETED")
		if err != nil {
			return fmt.Errorf("the guest did not release the workspace device within %s: %w", unplugTimeout, err)
		}
		if ev.Get("data.device").String() == ShareDevice {
			break
		}
	}
	// From here the share is gone from the machine: rollback plugs it in
	// again. (A device the guest did not release is left as it is.)
	s.unplugged = true
	if _, err := s.c.Execute(ctx, "chardev-remove", map[string]string{"id": ShareChardev}); err != nil {
		return fmt.Errorf("removing the workspace device's socket: %w", err)
	}
	s.l.stopVirtiofsd(s.m, s.launch.VirtiofsdPid, 3*time.Second)
	return nil
}

// migrate writes the state through a descriptor QEMU is handed, and
// returns its size once QEMU says it completed.
func (s *suspension) migrate(ctx context.Context) (int64, error) {
	tmp := s.m.runFile(StateFile + ".tmp")
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("creating the state file: %w", err)
	}
	defer f.Close()
	fail := func(err error) (int64, error) { _ = os.Remove(tmp); return 0, err }
	if err := s.c.SendFD(ctx, "agentvm-state", f); err != nil {
		return fail(err)
	}
	if _, err := s.c.Execute(ctx, "migrate", map[string]string{"uri": "fd:agentvm-state"}); err != nil {
		return fail(fmt.Errorf("saving the state: %w", err))
	}
	if err := waitMigration(ctx, s.c); err != nil {
		_, _ = s.c.Execute(context.Background(), "migrate_cancel", nil)
		return fail(fmt.Errorf("saving the state: %w; QEMU's log %s says: %s", err, s.m.QEMULogPath(), orNothing(driver.TailFile(s.m.QEMULogPath(), 3))))
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, s.m.runFile(StateFile)); err != nil {
		return fail(err)
	}
	return fi.Size(), nil
}

// waitMigration polls query-migrate until the migration (either way)
// completed, or fails with QEMU's reason.
func waitMigration(ctx context.Context, c *qmp.Client) error {
	wctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	b := newBackoff(10*time.Millisecond, 250*time.Millisecond)
	for {
		r, err := c.Execute(wctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		switch st := r.Get("status").String(); st {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("QEMU says the migration %s: %s", st, orNothing(r.Get("error-desc").String()))
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("the migration did not complete within %s", migrateTimeout)
		case <-time.After(b.next()):
		}
	}
}

// rollback puts a VM whose suspend failed back as it was: the share
// device plugged in again (with a new virtiofsd), CPUs running, the share
// mounted in the guest.
func (s *suspension) rollback(g driver.GuestHooks) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	if s.ramApart {
		_ = os.Remove(s.m.runFile(RAMFile))
		if err := setIgnoreShared(ctx, s.c, false); err != nil {
			errs = append(errs, err)
		}
	}
	if s.stopped {
		if _, err := s.c.Execute(ctx, "cont", nil); err != nil {
			errs = append(errs, err)
		}
	}
	if s.unplugged {
		pid, err := s.l.plugVirtiofs(ctx, s.c, s.m, s.v)
		if err != nil {
			errs = append(errs, err)
		} else if err := s.l.recordVirtiofsd(s.m, pid); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := g.Attach(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
