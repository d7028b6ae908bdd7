package qemu

// Clones: a machine that has never run starts from another
// machine's saved state, a template's (internal/template builds
// one with Suspend and says when to use it).
//
// What may differ between the template and its clone is what the guest
// does not see or re-reads: the host-side plumbing (machineKey leaves it
// out: sockets, forwards, logs), and the files behind the guest's devices
// (shapeKey leaves them out: the disks' paths, the fw_cfg files' paths,
// the SMBIOS uuid the guest read at its boot). Everything else, the
// devices and their order, size, accelerator, kernel and its command line,
// must be the template's, as QEMU's migration needs; a clone that differs
// is refused (ErrStaleState) before QEMU starts, naming the difference.
//
// The clone's writable disk is its own overlay on the template's (frozen)
// overlay, so the guest's page cache of the template's disk stays true.
// A fw_cfg file is read by the guest when it asks, so the clone's MCP token
// reaches it (at the same size as the template's, which the guest's
// fw_cfg driver learnt at its boot). The seed disk's content differs (the
// clone's own seed, for its later cold boots); the restored guest does
// not read it again.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/proc"
)

// Clone starts m, which has never run, from the saved state of from (a
// template), with m's own plumbing, disks and share, and returns once the
// guest runs with m's share plugged in. The template's state is read, not
// consumed. edits are made in the restored memory before the guest runs
// (editMemory); the caller gives the guest the rest of its identity
// afterwards.
func (l *Launcher) Clone(ctx context.Context, m Machine, b Boot, o StartOptions, from Machine, edits []driver.MemoryEdit) (*Launch, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	if b.Direct == nil {
		return nil, fmt.Errorf("cloning %s: a run script's machine cannot start from a template: %w", m.Name, driver.ErrUnsupported)
	}
	s, err := readSavedState(from)
	if err != nil {
		return nil, fmt.Errorf("the template has no usable saved state (%v): %w", err, driver.ErrStaleState)
	}
	if s.Share != driver.ShareVirtiofs || o.Virtiofsd == nil {
		return nil, fmt.Errorf("a template shares the workspace over virtiofs (its device is plugged in after the restore), and this start would use %s: %w", orNothing(string(s.Share)), driver.ErrStaleState)
	}
	version, err := qemuVersion(ctx, l.Run, l.Arch.Binary)
	if err != nil {
		return nil, err
	}
	h := l.hardening(m, b)
	key := machineKey(ResumeArgv(l.Arch, m, b.Direct, o.Accel, s.Share, h))
	if err := checkTemplate(s, version, key); err != nil {
		return nil, fmt.Errorf("%w: %w", err, driver.ErrStaleState)
	}
	o.resume, o.share = true, s.Share
	began := time.Now()
	launch, err := l.start(ctx, m, b, o)
	if err != nil {
		return nil, err
	}
	l.Log.Debug("QEMU waits for the template's state", "vm", m.Name, "after", time.Since(began))
	if err := l.restore(ctx, m, s, from, o.Virtiofsd, launch, edits); err != nil {
		proc.Kill(launch.QEMUPid, m.isQEMU())
		l.stopStrayVirtiofsds(m)
		l.cleanup(m)
		_ = os.Remove(m.runFile(LaunchFile))
		return nil, fmt.Errorf("starting %s from the template: %w", m.Name, err)
	}
	l.Log.Debug("restored the template's state, the share plugged in", "vm", m.Name, "after", time.Since(began))
	return launch, nil
}

// checkTemplate compares a template's saved state with the clone a start
// would make now: the same QEMU, the same machine shape, and the
// template's disks as they were saved (a template disk changed since would
// not match the memory's view of it).
func checkTemplate(s *savedState, version string, key []string) error {
	if s.QEMU != version {
		return fmt.Errorf("the template was saved by QEMU %s and this host's QEMU is %s", s.QEMU, version)
	}
	if saved, now := shapeKey(s.MachineArgs), shapeKey(key); !slices.Equal(saved, now) {
		return fmt.Errorf("the machine differs from the template's (%s)", argvDiff(saved, now))
	}
	var paths []string
	for _, d := range s.Disks {
		paths = append(paths, d.Path)
	}
	now, err := diskIDs(paths)
	if err != nil {
		return fmt.Errorf("the template's disk: %w", err)
	}
	for i, d := range now {
		if d != s.Disks[i] {
			return fmt.Errorf("the template's disk %s changed since it was saved", d.Path)
		}
	}
	return nil
}

// shapeKey is a machine key (machineKey) without the files behind the
// guest's devices and the SMBIOS uuid: what a clone shares with its
// template.
func shapeKey(key []string) []string {
	out := slices.Clone(key)
	for i := 0; i+1 < len(out); i++ {
		v := out[i+1]
		switch out[i] {
		case "-uuid":
			out[i+1] = "UUID"
		case "-drive":
			if rest, ok := strings.CutPrefix(v, "file="); ok {
				out[i+1] = "file=DISK" + rest[len(esc(unesc(rest))):]
			}
		case "-fw_cfg":
			if j := strings.Index(v, ",file="); j >= 0 {
				out[i+1] = v[:j] + ",file=FILE"
			}
		}
	}
	return out
}
