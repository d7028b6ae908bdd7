package vm_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/fork"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// Checkpoints run over the same real pieces as forks (fork_test.go): git
// workspaces, qcow2 disks written and read with qemu-io, the state
// directory; a running VM is the labelled fake QEMU.

// diskHas fails the test unless the disk reads pattern (a byte, as qemu-io
// takes it) over its first MiB.
func diskHas(t *testing.T, disk, pattern string) {
	t.Helper()
	out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "read -P "+pattern+" 0 1M", disk).CombinedOutput()
	if err != nil || strings.Contains(string(out), "Pattern verification failed") {
		t.Errorf("%s does not read %s: %v\n%s", disk, pattern, err, out)
	}
}

func writeDisk(t *testing.T, disk, pattern string) {
	t.Helper()
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P "+pattern+" 0 1M", disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
}

// A checkpoint, changes to the workspace and the disk, a rollback: the
// workspace is the checkpoint's exactly (a deleted file back, a new file
// and a new commit gone, an uncommitted change as it was) and so is the
// disk; what was replaced is a checkpoint, and rolling back to it brings
// the changes back.
func TestCheckpointAndRollback(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	w := newWorkedVM(t, m, "feat")
	e, ws := w.e, w.ws
	head := w.head
	disk := filepath.Join(e.Layout.Dir, debian.DiskFile)

	c, err := forks(m).Checkpoint(ctx, "feat", "one", 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "one" || c.Commit != head || c.State != driver.StateStopped || c.DiskBytes == 0 || c.Files == 0 {
		t.Errorf("checkpoint %+v", c)
	}
	// The agent goes on: deletes, adds, commits, changes the guest's disk.
	os.Remove(filepath.Join(ws, "notes.txt"))
	tu.WriteFile(t, filepath.Join(ws, "later.txt"), "made after the checkpoint\n")
	tu.Git(t, ws, "add", "later.txt")
	tu.Git(t, ws, "commit", "--quiet", "-m", "later")
	writeDisk(t, disk, "0x77")

	rb, err := forks(m).Rollback(ctx, "feat", "one")
	if err != nil {
		t.Fatal(err)
	}
	if rb.To.Name != "one" || !strings.HasPrefix(rb.Saved.Name, "before-rollback-") || rb.Saved.Replaced != "one" {
		t.Errorf("rollback %+v", rb)
	}
	if got := tu.Git(t, ws, "rev-parse", "HEAD"); got != head {
		t.Errorf("HEAD %s after the rollback, want %s", got, head)
	}
	if _, err := os.Stat(filepath.Join(ws, "later.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("later.txt after the rollback: %v, want it gone", err)
	}
	for name, want := range map[string]string{"notes.txt": "untracked\n", "README.md": "changed, not committed\n", "build/out.bin": "ignored\n"} {
		if got, _ := os.ReadFile(filepath.Join(ws, name)); string(got) != want {
			t.Errorf("%s after the rollback: %q, want %q", name, got, want)
		}
	}
	diskHas(t, disk, "0x5a")

	// Undone by another rollback.
	if _, err := forks(m).Rollback(ctx, "feat", rb.Saved.Name); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "later.txt")); string(got) != "made after the checkpoint\n" {
		t.Errorf("later.txt after undoing the rollback: %q", got)
	}
	diskHas(t, disk, "0x77")

	cs, err := forks(m).Checkpoints(ctx, "feat")
	if err != nil || len(cs) != 3 || cs[0].Name != "one" {
		t.Errorf("checkpoints: %+v, %v; want one, then the two made by the rollbacks", cs, err)
	}
	if err := forks(m).RemoveCheckpoint(ctx, "feat", "one"); err != nil {
		t.Fatal(err)
	}
	if cs, _ := forks(m).Checkpoints(ctx, "feat"); len(cs) != 2 {
		t.Errorf("checkpoints after rm: %+v", cs)
	}
	left, _ := filepath.Glob(filepath.Join(e.Layout.Dir, fork.CheckpointsDir, ".*"))
	if staged, _ := filepath.Glob(filepath.Join(e.Layout.Dir, ".workspace*")); len(left)+len(staged) > 0 {
		t.Errorf("left behind: %q %q", left, staged)
	}
}

// A checkpoint links the workspace's files unchanged since the one before
// to that one's, and copies the rest; neither is written through the
// other, nor does a rollback's workspace share a file with a checkpoint.
// checkpoint list counts a shared file once in all.
func TestCheckpointsShareUnchangedFiles(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	w := newWorkedVM(t, m, "feat")
	e, ws := w.e, w.ws
	// Files changed within a few seconds of a copy are never linked (their
	// stamps could hide a change in the same tick of the clock).
	time.Sleep(3500 * time.Millisecond)
	one, err := forks(m).Checkpoint(ctx, "feat", "one", 0)
	if err != nil {
		t.Fatal(err)
	}
	if one.Shared != 0 || one.Space != one.Bytes {
		t.Errorf("the first checkpoint shares %d bytes, space %d of %d; want none shared", one.Shared, one.Space, one.Bytes)
	}
	tu.WriteFile(t, filepath.Join(ws, "README.md"), "changed again after one\n")
	tu.WriteFile(t, filepath.Join(ws, "new.txt"), "new\n")
	two, err := forks(m).Checkpoint(ctx, "feat", "two", 0)
	if err != nil {
		t.Fatal(err)
	}
	if two.Shared == 0 || two.Shared >= two.Bytes {
		t.Errorf("the second checkpoint shares %d of %d bytes; want the unchanged files", two.Shared, two.Bytes)
	}
	cp := func(name, rel string) string {
		return filepath.Join(e.Layout.Dir, fork.CheckpointsDir, name, state.WorkspaceDir, rel)
	}
	for rel, want := range map[string]bool{"notes.txt": true, "build/out.bin": true, "done.txt": true, "README.md": false} {
		a, errA := os.Stat(cp("one", rel))
		b, errB := os.Stat(cp("two", rel))
		if errA != nil || errB != nil || os.SameFile(a, b) != want {
			t.Errorf("%s: one and two share it %v (%v, %v), want %v", rel, errA == nil && errB == nil && os.SameFile(a, b), errA, errB, want)
		}
	}
	if got, _ := os.ReadFile(cp("one", "README.md")); string(got) != "changed, not committed\n" {
		t.Errorf("checkpoint one's README.md is now %q", got)
	}
	cs, err := forks(m).Checkpoints(ctx, "feat")
	if err != nil || len(cs) != 2 {
		t.Fatalf("checkpoints: %+v, %v", cs, err)
	}
	// Each shared file is counted once in all (halves rounded down).
	if all, want := cs[0].Space+cs[1].Space, one.Bytes+two.Bytes-two.Shared; cs[0].Shared != two.Shared || all > want || all < want-int64(two.Files) {
		t.Errorf("listed: one shares %d (want %d), space %d in all, want about %d", cs[0].Shared, two.Shared, all, want)
	}

	if _, err := forks(m).Rollback(ctx, "feat", "one"); err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(ws, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err == nil && fi.Sys().(*syscall.Stat_t).Nlink != 1 {
			t.Errorf("%s of the rolled-back workspace has %d links: it must be a file of its own", path, fi.Sys().(*syscall.Stat_t).Nlink)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	cs, _ = forks(m).Checkpoints(ctx, "feat")
	for _, c := range cs {
		if c.Name != "two" {
			if err := forks(m).RemoveCheckpoint(ctx, "feat", c.Name); err != nil {
				t.Fatal(err)
			}
		}
	}
	if cs, err := forks(m).Checkpoints(ctx, "feat"); err != nil || len(cs) != 1 || cs[0].Shared != 0 || cs[0].Space != cs[0].Bytes {
		t.Errorf("two alone: %+v, %v; want nothing shared", cs, err)
	}
}

// A running VM's checkpoint pauses it for the copy and continues it; a
// running VM is not rolled back. Labelled fake: QEMU is qemutest's.
func TestCheckpointOfARunningVM(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	writeFirst := stopWrites(t, m, "feat")
	fake := runningClone(t, m, "feat")
	forkDisk(t, fake.Entry.Layout)
	writeFirst()
	c, err := forks(m).Checkpoint(ctx, "feat", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	lastWritten(t, filepath.Join(fake.Entry.Layout.Dir, fork.CheckpointsDir, c.Name, state.WorkspaceDir))
	if c.State != driver.StateRunning || c.Paused <= 0 || c.Name == "" {
		t.Errorf("checkpoint %+v: want the running VM paused for it, named by the time", c)
	}
	if _, _, live, err := m.Inspect(ctx, fake.Entry); err != nil || live.State != driver.StateRunning {
		t.Errorf("the VM after the checkpoint: %+v, %v; want it running", live, err)
	}
	_, err = forks(m).Rollback(ctx, "feat", c.Name)
	if err == nil || !strings.Contains(err.Error(), "agent-vm stop feat") {
		t.Errorf("rollback of a running VM: %v, want a refusal naming stop", err)
	}
}

// What checkpoint, rollback and rm refuse, changing nothing.
func TestCheckpointRefuses(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	w := newWorkedVM(t, m, "feat")
	e := w.e
	base := w.base
	if _, err := forks(m).Checkpoint(ctx, "feat", "one", 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		do   func() error
		want string
	}{
		{"a bad name", func() error { _, err := forks(m).Checkpoint(ctx, "feat", "Bad Name", 0); return err }, `checkpoint name "Bad Name"`},
		{"a reserved name", func() error { _, err := forks(m).Checkpoint(ctx, "feat", "list", 0); return err }, `checkpoint name "list"`},
		{"a name taken", func() error { _, err := forks(m).Checkpoint(ctx, "feat", "one", 0); return err }, `has a checkpoint "one" already`},
		{"rollback to none", func() error { _, err := forks(m).Rollback(ctx, "feat", "two"); return err }, `no checkpoint "two": it has one`},
		{"rm of none", func() error { return forks(m).RemoveCheckpoint(ctx, "feat", "two") }, `no checkpoint "two"`},
		{"the checkpoint's base image gone, the VM's there", func() error {
			// The VM's disk now on another base (as after a reset onto a
			// rebuilt image), the checkpoint's base pruned.
			os.Remove(filepath.Join(e.Layout.Dir, debian.DiskFile))
			os.Remove(filepath.Join(e.Layout.Dir, debian.DiskInfoFile))
			forkDisk(t, e.Layout)
			os.Rename(base, base+".away")
			defer os.Rename(base+".away", base)
			_, err := forks(m).Rollback(ctx, "feat", "one")
			return err
		}, "is gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			cs, _ := forks(m).Checkpoints(ctx, "feat")
			if len(cs) != 1 {
				t.Errorf("checkpoints after the refusal: %+v", cs)
			}
		})
	}
}

// A checkpoint that fills the disk (a small tmpfs for the VM's
// checkpoints) leaves nothing of itself.
func TestCheckpointLeavesNothingWhenTheDiskFills(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "mounts a tmpfs: needs root")
	m := debianManager(t)
	ctx := context.Background()
	w := newWorkedVM(t, m, "feat")
	e := w.e
	dir := filepath.Join(e.Layout.Dir, fork.CheckpointsDir)
	os.MkdirAll(dir, 0o700)
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	if _, err := forks(m).Checkpoint(ctx, "feat", "big", 0); err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("got %v, want the full disk named", err)
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Errorf("left in %s: %v", dir, left)
	}
}

// checkpoint --keep N removes the oldest beyond N, naming them.
func TestCheckpointKeepsTheNewest(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	_, ws := stoppedVM(t, m, "feat")
	forkWork(t, ws)
	var pruned []string
	for _, name := range []string{"a", "b", "c", "d"} {
		c, err := forks(m).Checkpoint(ctx, "feat", name, 2)
		if err != nil {
			t.Fatal(err)
		}
		pruned = append(pruned, c.Pruned...)
	}
	cs, err := forks(m).Checkpoints(ctx, "feat")
	if err != nil || len(cs) != 2 || cs[0].Name != "c" || cs[1].Name != "d" || strings.Join(pruned, ",") != "a,b" {
		t.Errorf("checkpoints %+v (%v), pruned %q; want c and d kept, a and b removed", cs, err, pruned)
	}
}

// Automatic checkpoints (auto-TIME) keep as many of their own as the VM's
// schedule says, and leave the others alone; no other checkpoint may take
// their prefix. Schedule keeps the schedule in the record.
func TestAutoCheckpointsKeepTheirOwn(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	_, ws := stoppedVM(t, m, "feat")
	forkWork(t, ws)
	if _, err := forks(m).Checkpoint(ctx, "feat", "mine", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := forks(m).Checkpoint(ctx, "feat", "auto-x", 0); err == nil || !strings.Contains(err.Error(), "automatic checkpoints'") {
		t.Errorf("a checkpoint named auto-x: %v, want a refusal", err)
	}
	r, err := forks(m).Schedule(ctx, "feat", &state.AutoCheckpoint{Every: "10m0s", Keep: 2})
	if err != nil || r.AutoCheckpoint == nil || r.AutoCheckpoint.Keep != 2 {
		t.Fatalf("Schedule: %+v, %v", r, err)
	}
	if e, _ := m.Find(ctx, "feat"); e.Record.AutoCheckpoint == nil || e.Record.AutoCheckpoint.Every != "10m0s" {
		t.Errorf("the record's schedule: %+v", e.Record.AutoCheckpoint)
	}
	var pruned []string
	for range 4 {
		c, err := forks(m).AutoCheckpoint(ctx, "feat")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(c.Name, fork.AutoPrefix) {
			t.Errorf("an automatic checkpoint named %q", c.Name)
		}
		pruned = append(pruned, c.Pruned...)
	}
	cs, err := forks(m).Checkpoints(ctx, "feat")
	if err != nil || len(cs) != 3 || cs[0].Name != "mine" || len(pruned) != 2 {
		t.Errorf("checkpoints %+v (%v), pruned %q; want mine and the two newest automatic ones", cs, err, pruned)
	}
	if r, err := forks(m).Schedule(ctx, "feat", nil); err != nil || r.AutoCheckpoint != nil {
		t.Errorf("Schedule(nil): %+v, %v", r, err)
	}
}
