package fork

// Checkpoints: points of a VM to come back to (`agent-vm checkpoint`,
// `checkpoint list|rm`, `rollback`). A checkpoint is what a fork copies,
// kept in the VM's own directory instead of made a VM: the workspace's
// exact tree (gitws.Copying: its commits, index, uncommitted, untracked and
// ignored files) and the root disk (backend.Forker), in
// checkpoints/NAME/ with a checkpoint.json that describes it. The VM is
// kept still for the copy as for a fork (a running one paused). The VM's
// holder takes automatic ones (auto-TIME) on the schedule its record keeps
// (internal/autocheckpoint), keeping only the newest few of those.
//
// A rollback puts a checkpoint back into the stopped VM: the disk and the
// workspace as they were, files made since gone. What it replaces becomes
// a checkpoint of its own first (before-rollback-TIME), so nothing is lost
// and a rollback is undone by another. Like forks, checkpoints are cold:
// the VM's memory is not in them, and it boots afresh after a rollback.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/autocheckpoint"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Files of the checkpoints in a VM's directory.
const (
	CheckpointsDir = "checkpoints"     // one directory per checkpoint, by name
	CheckpointFile = "checkpoint.json" // in each: the Checkpoint
	// StampsFile is, in each, what the workspace's copy saw of its files
	// (gitws.Copying's WriteStamps): the next checkpoint links the files
	// unchanged since to this one's rather than copying them again.
	StampsFile = "workspace.stamps"
)

// Checkpoint describes one checkpoint (checkpoint.json; checkpoint list
// --json prints them).
type Checkpoint struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// State is the VM's when the checkpoint was taken.
	State string `json:"state"`
	// Commit is the workspace's HEAD then ("" on an unborn branch).
	Commit string `json:"commit"`
	// Files and Bytes are the workspace's regular files; DiskBytes the
	// root disk's copy (0: the VM had not booted).
	Files     int   `json:"files"`
	Bytes     int64 `json:"bytes"`
	DiskBytes int64 `json:"disk_bytes"`
	// Shared is how much of Bytes is in files the workspace's copy shares
	// with other checkpoints' (a file unchanged from one checkpoint to the
	// next is one file on the host's disk, linked from both); Space is
	// this checkpoint's part of the space the checkpoints' workspaces
	// take (a shared file counted in equal parts), so that the Spaces and
	// DiskBytes of a VM's checkpoints add up to what they take. checkpoint
	// list reads both from the files as they are then; when a checkpoint
	// is taken, Shared is what it linked and Space what it added.
	Shared int64 `json:"shared_bytes"`
	Space  int64 `json:"space_bytes"`
	// Skipped are the workspace's entries a copy cannot carry (sockets,
	// FIFOs, devices).
	Skipped []string `json:"skipped,omitempty"`
	// Replaced names the checkpoint whose rollback this one was made by,
	// from what the VM had then ("" for one taken with checkpoint).
	Replaced string `json:"replaced,omitempty"`
	// Paused is how long a running VM was paused for the copy, Unsynced
	// why its guest could not sync first, and Pruned the older checkpoints
	// removed to keep the number asked for (output only).
	Paused   time.Duration `json:"-"`
	Unsynced string        `json:"-"`
	Pruned   []string      `json:"-"`
}

// nameRE is a checkpoint's name: a directory name, short, without a dot
// first.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// reserved are the names `checkpoint` reads as its subcommands.
var reserved = []string{"list", "rm", "help"}

// AutoPrefix begins the names of the checkpoints the VM's holder takes
// (AutoCheckpoint), which no other checkpoint's may.
const AutoPrefix = "auto-"

// CheckName refuses a name that is no name for a new checkpoint.
func CheckName(name string) error {
	if !named(name) || strings.HasPrefix(name, AutoPrefix) {
		return fmt.Errorf("checkpoint name %q: use lower-case letters, digits, '.', '_' and '-', up to 63, starting with a letter or digit, not %s, and not beginning with %s, which is the automatic checkpoints' (hint: before-refactor)", name, strings.Join(reserved, ", "), AutoPrefix)
	}
	return nil
}

// Checkpoint takes a checkpoint of the VM vm called name ("" for one
// named by the time). keep > 0 then removes the oldest of the VM's
// checkpoints until keep are left (Pruned names them), so that taking them
// as the agent works uses a bounded disk.
func (f Forks) Checkpoint(ctx context.Context, vm, name string, keep int) (*Checkpoint, error) {
	if name != "" {
		if err := CheckName(name); err != nil {
			return nil, err
		}
	}
	return f.take(ctx, vm, name, keep, false)
}

// AutoCheckpoint takes an automatic checkpoint of the VM vm (named
// auto-TIME), and removes the oldest automatic ones beyond the number its
// schedule keeps (autocheckpoint.DefaultKeep without one); the others
// stay.
func (f Forks) AutoCheckpoint(ctx context.Context, vm string) (*Checkpoint, error) {
	return f.take(ctx, vm, "", 0, true)
}

// Schedule sets the VM vm's automatic checkpoints (nil: none), which its
// holder takes from the record.
func (f Forks) Schedule(ctx context.Context, vm string, a *state.AutoCheckpoint) (*state.Record, error) {
	e, lock, err := f.VMs.Locked(ctx, vm)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	if _, err := f.check(e.Record); err != nil {
		return nil, err
	}
	e.Record.AutoCheckpoint = a
	return e.Record, state.WriteRecord(e.Layout.Record(), e.Record)
}

// take is Checkpoint, and AutoCheckpoint when auto.
func (f Forks) take(ctx context.Context, vm, name string, keep int, auto bool) (*Checkpoint, error) {
	e, lock, err := f.VMs.Locked(ctx, vm)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	forker, err := f.check(e.Record)
	if err != nil {
		return nil, err
	}
	if auto {
		name = uniqueName(filepath.Join(e.Layout.Dir, CheckpointsDir), AutoPrefix+f.Now().UTC().Format("20060102-150405"))
		keep = autocheckpoint.DefaultKeep
		if a := e.Record.AutoCheckpoint; a != nil && a.Keep > 0 {
			keep = a.Keep
		}
	}
	st, err := f.still(ctx, e, "checkpoint")
	if err != nil {
		return nil, err
	}
	k, err := f.begin(ctx, e, name, st.runs())
	if err != nil {
		return nil, err
	}
	err = st.during(ctx, func() error { return k.copy(ctx, forker) })
	var c *Checkpoint
	if err == nil {
		c, err = k.seal(ctx, st.state, "")
	}
	if err != nil {
		k.abort()
		return nil, err
	}
	c.Paused, c.Unsynced = st.paused, st.unsynced
	if keep > 0 {
		all, err := list(e)
		if err != nil {
			return c, err
		}
		if auto {
			all = slices.DeleteFunc(all, func(x Checkpoint) bool { return !strings.HasPrefix(x.Name, AutoPrefix) })
		}
		for _, old := range all[:max(0, len(all)-keep)] {
			if err := f.remove(e, old.Name); err != nil {
				return c, err
			}
			c.Pruned = append(c.Pruned, old.Name)
		}
	}
	return c, nil
}

// keep copies the still VM of e, in state vmState, into a new checkpoint.
func (f Forks) keep(ctx context.Context, e state.Entry, forker backend.Forker, name, vmState, replaced string) (*Checkpoint, error) {
	k, err := f.begin(ctx, e, name, false)
	if err != nil {
		return nil, err
	}
	c, err := func() (*Checkpoint, error) {
		if err := k.copy(ctx, forker); err != nil {
			return nil, err
		}
		return k.seal(ctx, vmState, replaced)
	}()
	if err != nil {
		k.abort()
	}
	return c, err
}

// keeping is a checkpoint being made, under a hidden temporary name in
// the VM's checkpoints directory until seal renames it into place.
type keeping struct {
	f         Forks
	e         state.Entry
	name, tmp string
	at        time.Time
	ws        *gitws.Copying
	files     *gitws.ForkResult
	disk      backend.DiskFork
}

// begin makes the checkpoint's temporary directory and, when the VM runs
// on until it is paused (precopy), copies its workspace a first time.
func (f Forks) begin(ctx context.Context, e state.Entry, name string, precopy bool) (k *keeping, err error) {
	dir := filepath.Join(e.Layout.Dir, CheckpointsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	k = &keeping{f: f, e: e, at: f.Now().UTC()} // whole, so that checkpoints of one second keep their order
	if name == "" {
		name = uniqueName(dir, k.at.Format("20060102-150405"))
	}
	k.name = name
	if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
		return nil, fmt.Errorf("VM %q has a checkpoint %q already (hint: another name, or `agent-vm checkpoint rm --vm %s %s` first)", e.Record.Branch, name, e.Record.Slug, name)
	}
	if k.tmp, err = os.MkdirTemp(dir, "."+name+".tmp-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			k.abort()
		}
	}()
	if k.ws, err = f.copying(ctx, e.Layout.Workspace(), filepath.Join(k.tmp, state.WorkspaceDir), e.Record.Slug, precopy, lastStamped(e)); err != nil {
		return nil, err
	}
	return k, nil
}

// copy copies the still VM's workspace (again what changed since begin's
// copy) and disk.
func (k *keeping) copy(ctx context.Context, forker backend.Forker) (err error) {
	if k.files, err = k.f.finish(ctx, k.ws, k.e.Record.Slug); err != nil {
		return err
	}
	// ForkDisk sets the section of a record for a new VM; a checkpoint
	// keeps none, so it gets a copy whose paths say where the disk will lie.
	scratch := *k.e.Record
	scratch.Paths = state.Layout{Dir: k.final()}.Paths()
	began := time.Now()
	if k.disk, err = forker.ForkDisk(ctx, k.e.Layout, k.e.Record, state.Layout{Dir: k.tmp}, &scratch); err != nil {
		return fmt.Errorf("copying the disk of %q: %w", k.e.Record.Branch, err)
	}
	k.f.Log.Debug("disk copied", "vm", k.e.Record.Slug, "bytes", k.disk.Bytes, "took", time.Since(began))
	return nil
}

// seal describes the copy in its checkpoint.json, has its files written
// out to the disk, and renames it into place.
func (k *keeping) seal(ctx context.Context, vmState, replaced string) (*Checkpoint, error) {
	c := &Checkpoint{Name: k.name, CreatedAt: k.at, State: vmState, Commit: k.f.Git.Head(ctx, filepath.Join(k.tmp, state.WorkspaceDir)),
		Files: k.files.Files, Bytes: k.files.Bytes, DiskBytes: k.disk.Bytes, Skipped: k.files.Skipped, Replaced: replaced,
		Shared: k.files.LinkedBytes, Space: k.files.Bytes - k.files.LinkedBytes}
	raw, _ := json.MarshalIndent(c, "", "  ")
	if err := atomicfile.Write(filepath.Join(k.tmp, CheckpointFile), append(raw, '\n'), 0o600); err != nil {
		return nil, err
	}
	if err := k.ws.WriteStamps(filepath.Join(k.tmp, StampsFile)); err != nil {
		return nil, err
	}
	// The workspace's copies were written without a sync each: one of
	// the filesystem, before the checkpoint is in place, so that a crash
	// cannot leave one whose files are empty.
	if err := atomicfile.SyncFS(k.tmp); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := os.Rename(k.tmp, k.final()); err != nil {
		return nil, err
	}
	k.tmp = ""
	k.f.Log.Info("checkpoint taken", "vm", k.e.Record.Slug, "name", k.name, "disk_bytes", k.disk.Bytes)
	return c, atomicfile.SyncDir(filepath.Dir(k.final()))
}

func (k *keeping) final() string {
	return filepath.Join(k.e.Layout.Dir, CheckpointsDir, k.name)
}

// abort removes what was copied (nothing once sealed).
func (k *keeping) abort() {
	if k.tmp != "" {
		_ = os.RemoveAll(k.tmp)
	}
}

// uniqueName is base, or base-2, base-3 ... when dir has it already.
func uniqueName(dir, base string) string {
	name := base
	for i := 2; ; i++ {
		if _, err := os.Lstat(filepath.Join(dir, name)); errors.Is(err, fs.ErrNotExist) {
			return name
		}
		name = fmt.Sprintf("%s-%d", base, i)
	}
}

// Checkpoints lists the checkpoints of the VM vm, oldest first, with
// the space their workspaces take as it is now (Shared, Space).
func (f Forks) Checkpoints(ctx context.Context, vm string) ([]Checkpoint, error) {
	e, lock, err := f.VMs.Locked(ctx, vm)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	cs, err := list(e)
	if err != nil {
		return nil, err
	}
	for i := range cs {
		if cs[i].Shared, cs[i].Space, err = spaceOf(filepath.Join(e.Layout.Dir, CheckpointsDir, cs[i].Name, state.WorkspaceDir)); err != nil {
			return nil, err
		}
	}
	return cs, nil
}

// spaceOf is how much of the regular files under dir is in files with
// more than one link (shared: only checkpoints link to one another's
// files) and dir's part of their space, each file's size divided among
// its links.
func spaceOf(dir string) (shared, space int64, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n := int64(1)
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			n = int64(st.Nlink)
			shared += fi.Size()
		}
		space += fi.Size() / n
		return nil
	})
	return shared, space, err
}

// lastStamped is the directory of e's newest checkpoint that kept its
// workspace's stamps (StampsFile), "" for none: a new checkpoint's copy
// links the files unchanged since to that one's.
func lastStamped(e state.Entry) string {
	cs, err := list(e)
	if err != nil {
		return ""
	}
	for i := len(cs) - 1; i >= 0; i-- {
		dir := filepath.Join(e.Layout.Dir, CheckpointsDir, cs[i].Name)
		if _, err := os.Stat(filepath.Join(dir, StampsFile)); err == nil {
			return dir
		}
	}
	return ""
}

func list(e state.Entry) ([]Checkpoint, error) {
	dir := filepath.Join(e.Layout.Dir, CheckpointsDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []Checkpoint{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := []Checkpoint{}
	for _, d := range entries {
		if !d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			continue // one being made, or left by an interrupt
		}
		c, err := readCheckpoint(filepath.Join(dir, d.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, *c)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

func readCheckpoint(dir string) (*Checkpoint, error) {
	raw, err := os.ReadFile(filepath.Join(dir, CheckpointFile))
	if err != nil {
		return nil, fmt.Errorf("the checkpoint in %s: %w", dir, err)
	}
	var c Checkpoint
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("the checkpoint in %s: %w", dir, err)
	}
	return &c, nil
}

// named says whether name is a checkpoint's, a new one's or an automatic
// one's: a plain directory name.
func named(name string) bool { return nameRE.MatchString(name) && !slices.Contains(reserved, name) }

// find is the checkpoint called name of e, or an error that lists those
// there are.
func find(e state.Entry, name string) (string, *Checkpoint, error) {
	dir := filepath.Join(e.Layout.Dir, CheckpointsDir, name)
	if named(name) {
		if c, err := readCheckpoint(dir); err == nil {
			return dir, c, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", nil, err
		}
	}
	all, err := list(e)
	if err != nil {
		return "", nil, err
	}
	var names []string
	for _, c := range all {
		names = append(names, c.Name)
	}
	there := "it has none"
	if len(names) > 0 {
		there = "it has " + strings.Join(names, ", ")
	}
	return "", nil, fmt.Errorf("VM %q has no checkpoint %q: %s (hint: `agent-vm checkpoint list %s`)", e.Record.Branch, name, there, e.Record.Slug)
}

// RemoveCheckpoint removes the checkpoint called name of the VM vm.
func (f Forks) RemoveCheckpoint(ctx context.Context, vm, name string) error {
	e, lock, err := f.VMs.Locked(ctx, vm)
	if err != nil {
		return err
	}
	defer lock.Release()
	return f.remove(e, name)
}

// remove removes e's checkpoint called name; the caller holds e's lock.
func (f Forks) remove(e state.Entry, name string) error {
	dir, _, err := find(e, name)
	if err != nil {
		return err
	}
	// Renamed out of the list first, so an interrupted removal leaves no
	// half checkpoint behind.
	gone := filepath.Join(filepath.Dir(dir), "."+name+".rm-"+f.Now().UTC().Format("20060102T150405.000000000"))
	if err := os.Rename(dir, gone); err != nil {
		return err
	}
	f.Log.Info("checkpoint removed", "vm", e.Record.Slug, "name", name)
	return os.RemoveAll(gone)
}

// Rollback says what a rollback did.
type Rollback struct {
	Branch, Slug string
	// To is the checkpoint put back; Saved the one made from what the VM
	// had before (`rollback` to it undoes this one).
	To    Checkpoint
	Saved Checkpoint
}

// Rollback puts the checkpoint called name back into the stopped VM vm
// (see the top of this file).
func (f Forks) Rollback(ctx context.Context, vm, name string) (*Rollback, error) {
	e, lock, err := f.VMs.Locked(ctx, vm)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	r, l := e.Record, e.Layout
	forker, err := f.check(r)
	if err != nil {
		return nil, err
	}
	dir, to, err := find(e, name)
	if err != nil {
		return nil, err
	}
	_, _, live, err := f.VMs.Inspect(ctx, e)
	if err != nil {
		return nil, err
	}
	if live.State != driver.StateStopped && live.State != driver.StateCrashed {
		return nil, fmt.Errorf("VM %q is %s; a rollback replaces the disk and workspace it uses (hint: `agent-vm stop %s`, then roll back; what it has then is kept as a checkpoint)", r.Branch, live.State, r.Slug)
	}
	// The checkpoint's workspace, copied beside the VM's first: a failure
	// up to the disk's restore changes nothing.
	staged := filepath.Join(l.Dir, "."+state.WorkspaceDir+".rollback")
	_ = os.RemoveAll(staged) // an interrupted rollback's
	if _, err := f.Git.Copy(ctx, filepath.Join(dir, state.WorkspaceDir), staged); err != nil {
		return nil, err
	}
	defer os.RemoveAll(staged)
	// Its files are written out before it can replace the VM's: a crash
	// must not leave a workspace of empty files.
	if err := atomicfile.SyncFS(staged); err != nil {
		return nil, err
	}
	saved, err := f.keep(ctx, e, forker, uniqueName(filepath.Join(l.Dir, CheckpointsDir), "before-rollback-"+f.Now().UTC().Format("20060102-150405")), live.State, name)
	if err != nil {
		return nil, fmt.Errorf("keeping what VM %q has before the rollback: %w", r.Branch, err)
	}
	if _, err := forker.RestoreDisk(ctx, state.Layout{Dir: dir}, r, l); err != nil {
		// Nothing was replaced: the VM keeps what it has, so the copy of
		// it goes.
		_ = os.RemoveAll(filepath.Join(l.Dir, CheckpointsDir, saved.Name))
		return nil, err
	}
	old := filepath.Join(l.Dir, "."+state.WorkspaceDir+".replaced")
	_ = os.RemoveAll(old)
	if err := os.Rename(l.Workspace(), old); err != nil {
		return nil, fmt.Errorf("the disk of %q is checkpoint %s's, but its workspace could not be replaced: %w (hint: `agent-vm rollback --vm %s %s` again)", r.Branch, name, err, r.Slug, name)
	}
	if err := os.Rename(staged, l.Workspace()); err != nil {
		_ = os.Rename(old, l.Workspace())
		return nil, fmt.Errorf("the disk of %q is checkpoint %s's, but its workspace could not be replaced: %w (hint: `agent-vm rollback --vm %s %s` again)", r.Branch, name, err, r.Slug, name)
	}
	_ = os.RemoveAll(old) // kept in the checkpoint saved
	f.Log.Info("rolled back", "vm", r.Slug, "to", name, "saved", saved.Name)
	return &Rollback{Branch: r.Branch, Slug: r.Slug, To: *to, Saved: *saved}, nil
}
