// Package fork makes new VMs from a VM as it is (`agent-vm fork --vm SRC
// NEW...`): each a VM of its own on a new branch that starts at
// SRC's HEAD, with a copy of SRC's workspace as it is at that moment
// (uncommitted changes, untracked and ignored files; gitws.Copying) and a copy
// of SRC's root disk (its backend's backend.Forker), and with what must be
// its own: its record's id and name, host ports, SSH keys and pinned host
// key, MCP token. SRC's egress CA comes along (its guest trusts it), and
// the rest of SRC's record (size, agent, packages, network policy,
// secrets' placeholders; the secrets scoped to SRC alone are not the
// fork's: they are kept by VM id).
//
// This is a cold fork: the forks are made stopped, and their first start
// boots SRC's disk as a new machine (the backend gives the guest the fork's
// identity then). A running SRC is paused for the copy (its guest's
// writes synced first, so the copies hold them) and continued after; one
// suspended or paused in place stays so. Its workspace is copied once
// before the pause, and in the pause only what changed since is copied
// again, so the pause is a walk of the tree rather than the whole copy.
// What SRC's processes hold in memory does not come along: forking the
// memory needs QEMU to migrate the workspace's virtiofs device, which QEMU
// 7.2 refuses (docs/design.md, "Fork").
//
// Nothing is half made: every fork is built in a staging directory, and
// they are put in place together at the end; a failure, a full disk or an
// interrupt before that removes them all. SRC runs on whatever happened.
// SRC's lock is held throughout, so a second fork of it (or a start, a
// stop) waits for this one.
//
// Its tests are internal/vm's fork_test.go, which runs it over the real
// Manager, state directory, git and disks.
package fork

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/portbook"
	"github.com/agent-vm/agent-vm/internal/state"
)

// VMs is what a fork needs of agent-vm's VMs (internal/vm's Manager).
type VMs interface {
	// Locked finds the VM name means and takes its lock.
	Locked(ctx context.Context, name string) (state.Entry, *state.Lock, error)
	// List is every VM of the state directory.
	List(ctx context.Context) ([]state.Entry, error)
	// Inspect is the VM's driver, machine and live state.
	Inspect(ctx context.Context, e state.Entry) (driver.Driver, driver.Machine, driver.Live, error)
	// Backend is the backend of r's VM, or why this agent-vm cannot verb
	// it.
	Backend(r *state.Record, verb string) (backend.Backend, error)
	// Foreign says whether r's guest is the user's own (not agent-vm's).
	Foreign(r *state.Record) (backend.Foreign, bool)
	// Contains says whether r's VM runs behind its egress proxy (so it
	// needs a CA of its own).
	Contains(r *state.Record) bool
	// Connect opens an SSH connection to the running VM name means.
	Connect(ctx context.Context, name string) (*ssh.Client, string, error)
	// Book is the book of host ports.
	Book() *portbook.Book
}

// Forks makes forks of the VMs of Root.
type Forks struct {
	VMs  VMs
	Root *state.Root
	Git  *gitws.Git
	Log  hclog.Logger
	Now  func() time.Time
}

// Result says what a fork did.
type Result struct {
	// Source is SRC's branch and State its state when it was copied.
	Source, State string
	// Paused is how long SRC's CPUs were stopped for the copy (0: it was
	// not running).
	Paused time.Duration
	// Unsynced says why SRC's guest could not be asked to write its files
	// out first ("" when it was, or did not run): its last writes may be
	// missing from the copies.
	Unsynced string
	Forks    []Made
	// Forwards are SRC's own port forwards (`port add`), which the forks
	// do not get as they are (host ports are each VM's own): the caller
	// gives each fork the same guest ports on host ports of its own.
	Forwards []state.Forward
}

// Made is one fork (fork --json prints it).
type Made struct {
	Branch string      `json:"branch"`
	Slug   string      `json:"slug"`
	Ports  state.Ports `json:"ports"`
	// Commit is where the new branch starts: SRC's HEAD.
	Commit string `json:"commit"`
	// Files and Bytes are the workspace's regular files copied; Skipped
	// are the entries a copy cannot carry (sockets, FIFOs, devices).
	Files   int      `json:"files"`
	Bytes   int64    `json:"bytes"`
	Skipped []string `json:"skipped,omitempty"`
	// DiskBytes is the size of the root disk copied (0: SRC never booted,
	// so the fork makes its own disk at its first start).
	DiskBytes int64 `json:"disk_bytes"`
	// Forwards are the fork's own forwards of SRC's guest ports, which
	// the caller adds (Result.Forwards).
	Forwards []state.Forward `json:"forwards,omitempty"`
}

// guestSyncTimeout bounds the guest's sync before the pause: a guest that
// does not answer is copied as it is.
const guestSyncTimeout = 30 * time.Second

// Fork makes a fork of the VM src on each of branches (see the package
// doc).
func (f Forks) Fork(ctx context.Context, src string, branches []string) (*Result, error) {
	if len(branches) == 0 {
		return nil, errors.New("no branch to fork into (hint: agent-vm fork --vm SRC NEW [NEW...])")
	}
	e, lock, err := f.VMs.Locked(ctx, src)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	r := e.Record
	forker, err := f.check(r)
	if err != nil {
		return nil, err
	}
	st, err := f.still(ctx, e, "fork")
	if err != nil {
		return nil, err
	}
	if err := f.checkBranches(ctx, r, branches); err != nil {
		return nil, err
	}
	stages, err := f.claim(ctx, r, branches)
	defer func() {
		for _, s := range stages {
			s.abort()
		}
	}()
	if err != nil {
		return nil, err
	}

	res := &Result{Source: r.Branch, State: st.state, Forwards: r.Forwards}
	if err := f.precopy(ctx, e, stages, st.runs()); err != nil {
		return nil, err
	}
	err = st.during(ctx, func() error { return f.copyAll(ctx, e, forker, stages, res) })
	res.Paused, res.Unsynced = st.paused, st.unsynced
	if err != nil {
		return nil, err
	}
	for i, s := range stages {
		if res.Forks[i].Commit, err = f.Git.Branch(ctx, s.staging.Layout.Workspace(), s.branch); err != nil {
			return nil, err
		}
	}
	// The workspaces' copies were written without a sync each: one of the
	// filesystem, before the forks are in place, so that a crash cannot
	// leave one whose files are empty.
	if err := atomicfile.SyncFS(f.Root.Dir); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i, s := range stages {
		if _, err := s.staging.Commit(); err != nil {
			return nil, fmt.Errorf("putting the fork %q in place: %w", s.branch, err)
		}
		s.lock.Release()
		stages[i] = nil
		f.Log.Info("forked", "vm", s.rec.Slug, "from", r.Slug, "ssh_port", s.rec.Ports.SSH, "mcp_port", s.rec.Ports.MCP)
	}
	return res, nil
}

// stillness is how a VM is kept still while it is copied: a running one
// paused (its guest synced first), any other left as it is.
type stillness struct {
	f      Forks
	r      *state.Record
	mach   driver.Machine
	state  string        // the VM's state when it was looked at
	pauser driver.Pauser // set when it runs and is to be paused
	// What during did: how long the VM was paused, and why its guest
	// could not sync first ("" when it did, or did not run).
	paused   time.Duration
	unsynced string
}

// still looks at the VM of e (whose lock the caller holds) and says how it
// will be kept still for verb, or refuses a state it cannot be copied in.
func (f Forks) still(ctx context.Context, e state.Entry, verb string) (*stillness, error) {
	r := e.Record
	d, mach, live, err := f.VMs.Inspect(ctx, e)
	if err != nil {
		return nil, err
	}
	st := &stillness{f: f, r: r, mach: mach, state: live.State}
	switch live.State {
	case driver.StateStopped, driver.StateCrashed, driver.StateSuspended, driver.StatePaused:
	case driver.StateRunning:
		p, ok := d.(driver.Pauser)
		if !ok {
			return nil, fmt.Errorf("VM %q runs, and its %s driver cannot pause it for the copy (hint: `agent-vm stop %s` first)", r.Branch, d.Name(), r.Slug)
		}
		st.pauser = p
	default:
		return nil, fmt.Errorf("VM %q is %s; agent-vm can %s a VM that runs, is stopped or suspended (hint: wait for it, or `agent-vm stop %s`)", r.Branch, live.State, verb, r.Slug)
	}
	return st, nil
}

// runs reports whether the VM runs until during pauses it.
func (st *stillness) runs() bool { return st.pauser != nil }

// during runs copy with the VM still: a running VM's guest is asked to
// sync, the VM paused, and continued afterwards on every way out (an
// interrupt included, which must not leave it paused).
func (st *stillness) during(ctx context.Context, copy func() error) (err error) {
	if st.pauser == nil {
		return copy()
	}
	r := st.r
	st.unsynced = st.f.syncGuest(ctx, r)
	began := time.Now()
	if err := st.pauser.Pause(ctx, st.mach); err != nil {
		return fmt.Errorf("pausing VM %q for the copy: %w", r.Branch, err)
	}
	st.f.Log.Info("paused for the copy", "vm", r.Slug)
	defer func() {
		_, cerr := st.pauser.Continue(context.WithoutCancel(ctx), st.mach)
		st.paused = time.Since(began)
		if cerr != nil {
			cerr = fmt.Errorf("VM %q stays paused after the copy: %w (hint: `agent-vm resume %s`)", r.Branch, cerr, r.Slug)
			st.f.Log.Error(cerr.Error())
			err = errors.Join(err, cerr)
			return
		}
		st.f.Log.Info("continued after the copy", "vm", r.Slug, "paused", st.paused)
	}()
	return copy()
}

// check refuses a source VM whose kind cannot be forked, with the reason.
func (f Forks) check(r *state.Record) (backend.Forker, error) {
	if fr, foreign := f.VMs.Foreign(r); foreign {
		return nil, fmt.Errorf("VM %q runs a guest made from %s as it is, which agent-vm cannot give a copy of an identity of its own (keys, name, ports), so it does not fork it", r.Branch, fr.Config)
	}
	if r.Host != "" {
		return nil, fmt.Errorf("VM %q is placed on host %s, where its disk and workspace are; agent-vm forks only VMs of this machine yet (hint: `agent-vm create NEW --from %s --host %s` makes a VM there on a new branch from the commits)", r.Branch, r.Host, r.Branch, r.Host)
	}
	be, err := f.VMs.Backend(r, "fork")
	if err != nil {
		return nil, err
	}
	forker, ok := be.(backend.Forker)
	if !ok {
		return nil, fmt.Errorf("VM %q uses the %s backend, whose VMs agent-vm cannot fork yet: only the qemu backend's disk is a file of the VM's own that it can copy (hint: `agent-vm create NEW --from %s` makes a VM on a new branch from the commits)", r.Branch, r.Backend, r.Branch)
	}
	return forker, nil
}

// checkBranches refuses, before anything is made, a new branch that is not
// a valid name, is SRC's own, is given twice, or is a branch the source
// repository has already (`sync` brings a fork's commits home to its
// branch there, which must be new).
func (f Forks) checkBranches(ctx context.Context, r *state.Record, branches []string) error {
	for i, b := range branches {
		if err := f.Git.CheckBranchName(ctx, b); err != nil {
			return err
		}
		switch {
		case b == r.Branch:
			return fmt.Errorf("cannot fork %q into itself: a fork is a new branch (hint: agent-vm fork --vm %s NEW)", b, r.Slug)
		case slices.Contains(branches[:i], b):
			return fmt.Errorf("branch %q is given twice; each fork is a branch of its own", b)
		case f.Git.HasBranch(ctx, r.Git.Source, b):
			return fmt.Errorf("the repository %s has a branch %q already; a fork starts a new branch (hint: another name, or `agent-vm create %s` for a VM on that branch)", r.Git.Source, b, b)
		}
	}
	return nil
}

// stage is one fork being made.
type stage struct {
	branch  string
	lock    *state.Lock
	staging *state.Staging
	rec     *state.Record
	ws      *gitws.Copying // the copy of SRC's workspace, in staging
}

func (s *stage) abort() {
	if s == nil {
		return
	}
	if s.staging != nil {
		s.staging.Abort()
	}
	s.lock.Release()
}

// claim takes each new branch's VM name and staging directory, with its
// ports, keys and record, before SRC is paused: a branch that has a VM
// already is refused here.
func (f Forks) claim(ctx context.Context, r *state.Record, branches []string) ([]*stage, error) {
	var stages []*stage
	for _, b := range branches {
		entries, err := f.VMs.List(ctx)
		if err != nil {
			return stages, err
		}
		slug, lock, err := f.Root.Claim(ctx, b, r.Git.Repo, entries, func(state.Entry) {})
		if err != nil {
			return stages, err
		}
		s := &stage{branch: b, lock: lock}
		stages = append(stages, s)
		if s.staging, err = f.Root.BeginCreate(slug); err != nil {
			return stages, err
		}
		if s.rec, err = r.ForkAs(b, slug, f.Now()); err != nil {
			return stages, err
		}
		s.rec.Paths = f.Root.Layout(slug).Paths()
		l := s.staging.Layout
		if err := l.MakeDirs(); err != nil {
			return stages, err
		}
		if err := f.VMs.Book().Assign(ctx, 0, 0, s.rec, l); err != nil {
			return stages, err
		}
		if err := state.WriteSecrets(l, s.rec); err != nil {
			return stages, err
		}
		if f.VMs.Contains(s.rec) {
			if err := shareCA(f.Root.Layout(r.Slug), l); err != nil {
				return stages, err
			}
			if _, _, err := egress.CAFiles(l.ProxyCA(), l.ProxyCAKey(), slug); err != nil {
				return stages, err
			}
		}
	}
	return stages, nil
}

// shareCA gives the fork in to SRC's egress CA (from), when SRC has one:
// the copy of SRC's disk trusts it, and a CA new to the guest would have
// its first start rebuild the guest's whole trust store (a minute under
// TCG). The key stays on the host, in each VM's directory, and only the
// VMs' proxies sign with it; a guest trusts it as it did.
func shareCA(from, to state.Layout) error {
	cert, cerr := os.ReadFile(from.ProxyCA())
	key, kerr := os.ReadFile(from.ProxyCAKey())
	if cerr != nil || kerr != nil {
		return nil // none (SRC ran uncontained): the fork makes its own
	}
	if err := atomicfile.Write(to.ProxyCAKey(), key, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(to.ProxyCA(), cert, 0o600)
}

// precopy makes each stage's copy of SRC's workspace and, when SRC runs
// on until it is paused (first), copies it a first time.
func (f Forks) precopy(ctx context.Context, e state.Entry, stages []*stage, first bool) (err error) {
	for _, s := range stages {
		// A fork's copy is its own: nothing linked, to SRC's checkpoints
		// or anything else.
		if s.ws, err = f.copying(ctx, e.Layout.Workspace(), s.staging.Layout.Workspace(), s.rec.Slug, first, ""); err != nil {
			return err
		}
	}
	return nil
}

// copying begins the copy of the workspace ws into dest, for the VM slug
// (in logs), reusing the checkpoint at reuse ("" for none: Copying.Reuse)
// and, when first (the VM runs until it is paused), copies it a first
// time.
func (f Forks) copying(ctx context.Context, ws, dest, slug string, first bool, reuse string) (*gitws.Copying, error) {
	c, err := f.Git.NewCopying(ws, dest)
	if err != nil {
		return nil, err
	}
	if reuse != "" {
		if err := c.Reuse(filepath.Join(reuse, state.WorkspaceDir), filepath.Join(reuse, StampsFile)); err != nil {
			f.Log.Warn("the checkpoint before is not reused: the workspace is copied whole", "vm", slug, "error", err)
		}
	}
	if !first {
		return c, nil
	}
	began := time.Now()
	if err := c.Precopy(ctx); err != nil {
		return nil, err
	}
	f.Log.Debug("workspace copied before the pause", "vm", slug, "took", time.Since(began))
	return c, nil
}

// finish finishes the copy c with the VM slug still.
func (f Forks) finish(ctx context.Context, c *gitws.Copying, slug string) (*gitws.ForkResult, error) {
	began := time.Now()
	res, err := c.Finish(ctx)
	if err == nil {
		f.Log.Debug("workspace copied", "vm", slug, "files", res.Files, "copied_again", res.Copied, "took", time.Since(began))
	}
	return res, err
}

// copyAll copies SRC's workspace (again what changed since precopy) and
// disk into each stage and writes its record; SRC is still meanwhile.
func (f Forks) copyAll(ctx context.Context, e state.Entry, forker backend.Forker, stages []*stage, res *Result) error {
	for _, s := range stages {
		l := s.staging.Layout
		ws, err := f.finish(ctx, s.ws, s.rec.Slug)
		if err != nil {
			return err
		}
		disk, err := forker.ForkDisk(ctx, e.Layout, e.Record, l, s.rec)
		if err != nil {
			return fmt.Errorf("copying the disk of %q: %w", e.Record.Branch, err)
		}
		if err := state.WriteRecord(l.Record(), s.rec); err != nil {
			return err
		}
		res.Forks = append(res.Forks, Made{Branch: s.branch, Slug: s.rec.Slug, Ports: s.rec.Ports,
			Files: ws.Files, Bytes: ws.Bytes, Skipped: ws.Skipped, DiskBytes: disk.Bytes})
	}
	return nil
}

// syncGuest asks the running guest to write its files out (to its disk and
// to the workspace share), so that the copies hold them; it returns why it
// could not, "" when it did.
func (f Forks) syncGuest(ctx context.Context, r *state.Record) string {
	ctx, cancel := context.WithTimeout(ctx, guestSyncTimeout)
	defer cancel()
	c, _, err := f.VMs.Connect(ctx, r.Slug)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return err.Error()
	}
	defer s.Close()
	done := make(chan error, 1)
	go func() { done <- s.Run("sync") }()
	select {
	case err := <-done:
		if err != nil {
			return "sync in the guest: " + err.Error()
		}
		return ""
	case <-ctx.Done():
		return fmt.Sprintf("the guest did not finish a sync within %s", guestSyncTimeout)
	}
}
