package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/portbook"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
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
		k.CAs = Hash([]byte(strings.Join(cas, "\x00")))
	}
	return k
}

// NewVMRecord is the record of the template's VM, slug, made at now for
// the VM whose record is from: from's size, owner ids and CA choice; its
// backend's section is the caller's (backend.Templater's TemplateSection).
func NewVMRecord(from *state.Record, slug string, now time.Time) *state.Record {
	return &state.Record{
		Version: state.RecordVersion, ID: state.NewID(), Branch: slug, Slug: slug, VMName: "agent-vm-" + slug,
		Backend: from.Backend, CreatedAt: now.UTC().Truncate(time.Second), Resources: from.Resources,
		Guest: state.Guest{User: guest.User, UID: from.Guest.UID, GID: from.Guest.GID, Proxy: true}, NoHostCA: from.NoHostCA,
	}
}

// Builder is the VMs of the templates' state directory as a build drives
// them: vm's Manager over that directory.
type Builder interface {
	// Start boots the template's VM, slug, cold (with its template seed)
	// until it is ready.
	Start(ctx context.Context, slug string) error
	// BootID asks its running guest where its kernel keeps its boot id.
	BootID(ctx context.Context, slug string) (*BootIDSite, error)
	// Suspend saves its machine; Stop ends it (a failed build's).
	Suspend(ctx context.Context, slug string) error
	Stop(ctx context.Context, slug string)
}

// New is what a build makes a template from.
type New struct {
	Root *state.Root // the templates' state directory
	VMs  *state.Root // the VMs' state directory (their ports are taken too)
	Book *portbook.Book
	// From is the record of the VM the template is for; Section is its
	// backend's section of the template's record
	// (backend.Templater.TemplateSection).
	From    *state.Record
	Section func() (any, error)
	Now     func() time.Time
}

// BuildResult says what a build did.
type BuildResult struct {
	Slug string
	Dir  string
	Took time.Duration
}

// Build makes the template of key k for the VM n.From, in n.Root, its VM
// made (create) and driven by b: booted cold, asked where its kernel keeps
// its boot id, suspended; then its disks are frozen and its template.json
// written. An existing template for k is refused (template rm first); a
// build that fails keeps nothing.
func Build(ctx context.Context, b Builder, n New, k Key, log hclog.Logger) (*BuildResult, error) {
	root, from, now := n.Root, n.From, n.Now
	if l, ok := Newest(root.Dir, k.Prefix()); ok {
		return nil, fmt.Errorf("a template for VM %q's machine exists already: %s (hint: `agent-vm template rm %s` first to build it again)", from.Branch, l.Dir, filepath.Base(l.Dir))
	}
	slug := k.Prefix() + now().UTC().Format("20060102t150405")
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
	if err := b.Start(ctx, slug); err != nil {
		return fail(err)
	}
	site, err := b.BootID(ctx, slug)
	if err != nil {
		log.Warn("the template's clones will share its kernel boot id", "reason", err)
	}
	if err := b.Suspend(ctx, slug); err != nil {
		return fail(err)
	}
	if err := Freeze(l.Dir); err != nil {
		return fail(err)
	}
	if err := Write(l.Dir, Record{Key: k, Built: now().UTC(), For: from.Branch, BootID: site}); err != nil {
		return fail(err)
	}
	return &BuildResult{Slug: slug, Dir: l.Dir, Took: time.Since(began)}, nil
}

// Pick is the templates of ts that slug names: the one of that slug, or
// every one for "all".
func Pick(ts []Info, slug string) []Info {
	var picked []Info
	for _, t := range ts {
		if slug == "all" || t.Slug == slug {
			picked = append(picked, t)
		}
	}
	return picked
}

// Remove removes the picked templates of root (Pick's; all: the user said
// "all", which leaves a removed template's disk that VMs use alone): each
// one's VM ended by stop (a build that was cut short may run; stopping
// discards a saved state), then, under its lock, retired (Retire: its
// disks in used stay).
func Remove(ctx context.Context, root *state.Root, picked []Info, all bool, used map[string]bool, stop func(ctx context.Context, slug string)) error {
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

// Find is the newest template in dir of key k for the VM called slug, or
// why there is none (one line, for the log).
func Find(dir string, k Key, slug string) (*Found, string) {
	l, ok := Newest(dir, k.Prefix())
	if !ok {
		return nil, None(slug)
	}
	name := filepath.Base(l.Dir)
	rec, err := Read(l.Dir)
	if err != nil {
		return nil, fmt.Sprintf("the template %s is unreadable: %v (hint: `agent-vm template rm %s`)", l.Dir, err, name)
	}
	tr, err := state.ReadRecord(l.Record())
	if err != nil {
		return nil, fmt.Sprintf("the template %s is unreadable: %v (hint: `agent-vm template rm %s`)", l.Dir, err, name)
	}
	return &Found{Entry: state.Entry{Slug: name, Layout: l, Record: tr}, Record: rec}, ""
}

// None says that the VM called slug has no template yet.
func None(slug string) string {
	return fmt.Sprintf("no template for this VM's machine yet (hint: `agent-vm template build %s` makes one)", slug)
}

// Personalize gives a clone its identity: restored, its guest is still the
// template's, so it logs in as the template (the template's client key,
// and its host key pinned for the clone's SSH port in the file
// knownHosts, removed after) and runs script (the backend's Personalize)
// as root. target is the clone's own endpoint; tl the template's
// directory. A failure says which step failed (phase).
func Personalize(ctx context.Context, tl state.Layout, target sshx.Target, port int, knownHosts, script string, began time.Time, log hclog.Logger) (phase string, err error) {
	pub, err := os.ReadFile(tl.HostPubKey())
	if err != nil {
		return "reading the template's host key", err
	}
	hk, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil {
		return "reading the template's host key", err
	}
	if err := atomicfile.Write(knownHosts, []byte(sshkeys.KnownHostsLine(port, hk)), 0o600); err != nil {
		return "writing the template's host key", err
	}
	defer os.Remove(knownHosts)
	target.KeyFile, target.KnownHosts = tl.ClientKey(), knownHosts
	c, err := sshx.WaitReady(ctx, target, nil)
	if err != nil {
		return "waiting for SSH after the restore", err
	}
	log.Debug("ssh answers with the template's key", "after", time.Since(began))
	var errOut strings.Builder
	code, err := sshx.Run(ctx, c, "sudo -n sh -s", strings.NewReader(script), io.Discard, &errOut)
	c.Close()
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errOut.String()))
	}
	if err != nil {
		return "giving the guest its identity", err
	}
	return "", nil
}
