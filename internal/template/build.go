package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/state"
)

// NewKey is the key of the VM whose record is r: accel is the accelerator
// it would run with, cas the CA certificates its guest trusts (none with
// r.NoHostCA), binary the agent-vm binary the guest runs, base its
// backend's section less its per-VM counters (backend.Templater's
// TemplateBase).
func NewKey(r *state.Record, accel string, cas []string, binary []byte, base string) Key {
	k := Key{Backend: r.Backend, Accel: accel, CPUs: r.Resources.CPUs, MemoryMiB: r.Resources.MemoryMiB,
		DiskGiB: r.Resources.DiskGiB, UID: r.Guest.UID, GID: r.Guest.GID, NoHostCA: r.NoHostCA, Contract: Contract,
		AgentVM: Hash(binary), Base: base}
	if !r.NoHostCA {
		k.CAs = CAsHash(cas)
	}
	return k
}

// NewVMRecord is the record of the template's VM, slug, made at now for
// the VM whose record is from: from's size, owner ids, CA choice, its
// packages (create --packages and its repository's config.toml: the
// template installs them, so that its clones need not) and network policy
// (what its first boot's installs may reach: `net allow BRANCH` before
// `template build BRANCH` lets them through); its backend's section is the
// caller's (backend.Templater's TemplateSection).
func NewVMRecord(from *state.Record, slug string, now time.Time) *state.Record {
	return &state.Record{
		Version: state.RecordVersion, ID: state.NewID(), Branch: slug, Slug: slug, MachineName: state.MachineName(slug),
		Backend: from.Backend, CreatedAt: now.UTC().Truncate(time.Second), Resources: from.Resources,
		Guest: state.Guest{User: guest.User, UID: from.Guest.UID, GID: from.Guest.GID, Proxy: true}, NoHostCA: from.NoHostCA,
		Net: from.Net, Packages: from.AllPackages(),
	}
}

// Builder is the VMs of the templates' state directory as a build drives
// them: vm's Manager over that directory.
type Builder interface {
	// Start boots the template's VM, slug, cold (with its template seed)
	// until it is ready, and finds it.
	Start(ctx context.Context, slug string) (state.Entry, error)
	// Root runs script as root in e's running guest.
	Root(ctx context.Context, e state.Entry, script string) (code int, stdout, stderr string, err error)
	// PullLog brings e's connection log here, for a failed install's
	// refusals (netpolicy.WithRefusals).
	netpolicy.LogPuller
	// Suspend saves its machine; Stop ends it (a failed build's).
	Suspend(ctx context.Context, slug string) error
	Stop(ctx context.Context, slug string)
}

// New is what a build makes a template from: the templates' directory,
// the VM the template is for and what it holds.
type New struct {
	Site
	// From is the record of the VM the template is for; Section is its
	// backend's section of the template's record
	// (backend.Templater.TemplateSection).
	From    *state.Record
	Section func() (any, error)
	// Branch is the VM the template is for, whose policy its first boot
	// has: the fixes of the proxy's refusals name it.
	Branch string
	Now    func() time.Time
	// Agents are the agent CLIs the template is to hold.
	Agents []guest.AgentPin
	// Used are the disks VMs' disks are made on (an older template's stay).
	Used func() map[string]int
}

// BuildResult says what a build did.
type BuildResult struct {
	Slug string
	Dir  string
	Took time.Duration
	// Agents are its agent CLIs' versions, by name; Replaced the older
	// templates of the same machine it replaced.
	Agents   map[string]string
	Replaced []string
}

// build makes the template of key k for the VM n.From, in n.Root, its VM
// made (create) and driven by n.Builder: booted cold (its agent CLIs installed),
// its agents checked, asked where its kernel keeps its boot id,
// suspended; then its disks are frozen and its template.json written. A
// build that fails keeps nothing of it, and the templates there were stay
// as they were; once it is made, an older template of k is retired
// (remove: its disk stays while VMs' disks are made on it), so a rebuild
// replaces a template without breaking the VMs started from it.
func build(ctx context.Context, n New, k Key, log hclog.Logger) (*BuildResult, error) {
	b, root, from, now := n.Builder, n.Root, n.From, n.Now
	if err := CheckSpace(root.Dir, from); err != nil {
		return nil, err
	}
	slug := k.Prefix() + now().UTC().Format("20060102t150405")
	if _, err := os.Stat(root.Layout(slug).Dir); err == nil {
		return nil, fmt.Errorf("a template of VM %q's machine is being built this very second: %s (hint: wait for it, then `agent-vm template list`)", from.Branch, slug)
	}
	began := time.Now()
	if err := create(ctx, n, slug); err != nil {
		return nil, err
	}
	l := root.Layout(slug)
	fail := func(err error) (*BuildResult, error) {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b.Stop(sctx, slug)
		if rerr := root.Remove(slug); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, fmt.Errorf("building the template: %w (nothing of it was kept)", err)
	}
	e, err := b.Start(ctx, slug)
	if err != nil {
		return fail(err)
	}
	agents, err := probeAgents(ctx, b, e, n.Agents, n.Branch, log)
	if err != nil {
		return fail(fmt.Errorf("its agent CLIs: %w", err))
	}
	trimMemory(ctx, b, e, n.Agents, log)
	site, err := probeBootID(ctx, b, e)
	if err != nil {
		log.Warn("the template's clones will share its kernel boot id", "reason", err)
	}
	if err := b.Suspend(ctx, slug); err != nil {
		return fail(err)
	}
	if err := Freeze(l.Dir); err != nil {
		return fail(err)
	}
	packages := from.AllPackages()
	if err := Write(l.Dir, Record{Key: k, Built: now().UTC(), For: from.Branch, BootID: site, Agents: agents, Packages: packages}); err != nil {
		return fail(err)
	}
	res := &BuildResult{Slug: slug, Dir: l.Dir, Took: time.Since(began), Agents: agents}
	used := n.Used()
	ts, err := list(root.Dir, used)
	if err != nil {
		log.Warn("the new template is made, but the templates it may replace could not be listed", "error", err)
	}
	for _, t := range ts {
		if !t.Ready || t.Slug == slug || !strings.HasPrefix(t.Slug, k.Prefix()) || !samePackages(t.Packages, packages) {
			continue // another machine's, or one with other packages (another repository's)
		}
		if err := remove(ctx, root, []Info{t}, false, used, b.Stop); err != nil {
			log.Warn("the new template is made, but the one it replaces could not be removed", "template", t.Slug, "error", err, "hint", "agent-vm template rm "+t.Slug)
			continue
		}
		res.Replaced = append(res.Replaced, t.Slug)
	}
	return res, nil
}

// trimCaches drops the guest's clean page cache, as root, and hands the
// memory it freed back to QEMU: compacted into 2 MiB blocks, which the
// balloon's free page reporting (internal/qemu) tells QEMU to discard, so
// they are zeros the saved state leaves out. The sleep is the kernel's
// reporting delay (2 s) and a little more.
const trimCaches = "sync\necho 3 > /proc/sys/vm/drop_caches\necho 1 > /proc/sys/vm/compact_memory\nsleep 3\n"

// trimMemory leaves in the template's guest memory what its clones use
// first, and little else: every clone loads all of it (about 150 MB/s
// under TCG), while the first build's page cache (apt's packages, npm's
// downloads, the agent CLIs as they were written) is most of it and
// mostly unused again. The page cache is dropped, then each agent CLI's
// --version is run again (AgentProbe), so the pages a clone's first agent
// start reads are in the saved state. A failure costs only speed.
func trimMemory(ctx context.Context, b Builder, e state.Entry, pins []guest.AgentPin, log hclog.Logger) {
	script := trimCaches
	if len(pins) > 0 {
		script += AgentProbe(pins)
	}
	code, _, stderr, err := b.Root(ctx, e, script)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(stderr))
	}
	if err != nil {
		log.Warn("the template keeps its guest's page cache, which its clones load at every start", "error", err)
	}
}

// pick is the templates of ts that slug names: the one of that slug, or
// every one for "all".
func pick(ts []Info, slug string) []Info {
	var picked []Info
	for _, t := range ts {
		if slug == "all" || t.Slug == slug {
			picked = append(picked, t)
		}
	}
	return picked
}

// remove removes the picked templates of root (pick's; all: the user said
// "all", which leaves a removed template's disk that VMs use alone): each
// one's VM ended by stop (a build that was cut short may run; stopping
// discards a saved state), then, under its lock, retired (Retire: its
// disks in used stay).
func remove(ctx context.Context, root *state.Root, picked []Info, all bool, used map[string]int, stop func(ctx context.Context, slug string)) error {
	for _, t := range picked {
		if !t.Ready && t.UsedBy > 0 && all {
			continue // a removed template's disk that VMs still use
		}
		stop(ctx, t.Slug)
		lock, err := root.LockVM(ctx, t.Slug)
		if err != nil {
			return err
		}
		err = Retire(root, t, used)
		lock.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

// Found is a template a VM fits: its VM's directory and record, and its
// template.json.
type Found struct {
	Entry  state.Entry
	Record Record
}

// Find is the template in dir of key k for the VM called slug, whose
// packages are packages: the newest that has all of them installed, else
// the newest (its clone installs the rest), or why there is none (one
// line, for the log).
func Find(dir string, k Key, slug string, packages []string) (*Found, string) {
	found, _ := filepath.Glob(filepath.Join(dir, k.Prefix()+"*", File))
	if len(found) == 0 {
		return nil, None(slug)
	}
	slices.Sort(found) // the build time sorts as text
	l := state.Layout{Dir: filepath.Dir(found[len(found)-1])}
	rec, err := Read(l.Dir)
	for _, f := range slices.Backward(found) {
		if r, rerr := Read(filepath.Dir(f)); rerr == nil && hasAll(r.Packages, packages) {
			l, rec, err = state.Layout{Dir: filepath.Dir(f)}, r, nil
			break
		}
	}
	name := filepath.Base(l.Dir)
	if err != nil {
		return nil, fmt.Sprintf("the template %s is unreadable: %v (hint: `agent-vm template rm %s`)", l.Dir, err, name)
	}
	tr, err := state.ReadRecord(l.Record())
	if err != nil {
		return nil, fmt.Sprintf("the template %s is unreadable: %v (hint: `agent-vm template rm %s`)", l.Dir, err, name)
	}
	return &Found{Entry: state.Entry{Slug: name, Layout: l, Record: tr}, Record: rec}, ""
}

// hasAll reports whether have holds every one of want.
func hasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// samePackages reports whether a and b are the same set.
func samePackages(a, b []string) bool { return hasAll(a, b) && hasAll(b, a) }

// None says that the VM called slug has no template yet.
func None(slug string) string {
	return fmt.Sprintf("no template for this VM's machine yet (hint: `agent-vm template build %s` makes one)", slug)
}

// diskHeadroomMiB is what a template's disk grows by over its base:
// the guest's first boot, the agent CLIs (Claude Code alone is about
// 350 MB unpacked) and the logs.
const diskHeadroomMiB = 2048

// CheckSpace refuses a build that would fill dir's file system: a
// template keeps its machine's saved memory (at most the guest's
// memory) and a disk of its own. A full disk in the middle of a build
// fails it too (and keeps nothing); this says so before the boot.
func CheckSpace(dir string, from *state.Record) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("checking the free space for the template in %s: %w", dir, err)
	}
	freeMiB := int64(st.Bavail) * int64(st.Bsize) >> 20
	need := int64(from.Resources.MemoryMiB) + diskHeadroomMiB
	if freeMiB < need {
		return fmt.Errorf("building a template of VM %q's machine needs about %d MiB free in %s (its saved memory, up to %d MiB, and its disk), and %d MiB are free (hint: free some space there: `agent-vm template rm all` and `agent-vm image prune` remove what no VM uses; the templates there are left as they are)",
			from.Branch, need, dir, from.Resources.MemoryMiB, freeMiB)
	}
	return nil
}
