package vm

// Templates (internal/template has their design): a template is a VM in
// the templates' state directory, built here by creating, booting and
// suspending it, and a VM's first start may clone one (startClone).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/template"
)

// templateRoot opens the templates' state directory.
func (m *Manager) templateRoot() (*state.Root, error) {
	if m.TemplateDir == nil {
		return nil, errors.New("internal error: no template directory")
	}
	return state.Open(m.TemplateDir)
}

// forTemplates is the Manager over the templates' directory: a template
// boots and suspends as any VM does.
func (m *Manager) forTemplates(root *state.Root) *Manager {
	t := *m
	t.Root, t.vmRoot = root, m.Root
	t.WorkDir = "" // templates belong to no repository
	return &t
}

// templater is r's backend when r's guest can start from a template: a
// backend.Templater run by a driver that can suspend and clone
// (driver.Suspender, driver.Cloner).
func (m *Manager) templater(r *state.Record) (backend.Templater, bool) {
	t, ok := m.Backends[r.Backend].(backend.Templater)
	if !ok {
		return nil, false
	}
	d, err := m.driverOf(r)
	if err != nil {
		return nil, false
	}
	_, suspends := d.(driver.Suspender)
	_, clones := d.(driver.Cloner)
	return t, suspends && clones
}

// templateKey computes r's key; t is r's backend.
func (m *Manager) templateKey(ctx context.Context, t backend.Templater, r *state.Record) (template.Key, error) {
	k := template.Key{Backend: r.Backend, Accel: m.Accel(ctx).Accel, CPUs: r.Resources.CPUs, MemoryMiB: r.Resources.MemoryMiB,
		DiskGiB: r.Resources.DiskGiB, UID: r.Guest.UID, GID: r.Guest.GID, NoHostCA: r.NoHostCA, Contract: template.Contract}
	if !r.NoHostCA {
		cas, err := m.HostCAs()
		if err != nil {
			return k, err
		}
		k.CAs = template.Hash([]byte(strings.Join(cas, "\x00")))
	}
	exe, err := m.executable()
	if err != nil {
		return k, err
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		return k, fmt.Errorf("reading the agent-vm binary the guest runs: %w", err)
	}
	k.AgentVM = template.Hash(b)
	if k.Base, err = t.TemplateBase(r); err != nil {
		return k, err
	}
	return k, nil
}

// executable is the agent-vm binary (Manager.Executable, else this one).
func (m *Manager) executable() (string, error) {
	if m.Executable != nil {
		return m.Executable()
	}
	return os.Executable()
}

// usable is a usable template for a VM.
type usable struct {
	e    state.Entry
	rec  template.Record
	mach driver.Machine
}

// findTemplate returns the template r fits, or why there is none (one
// line, for the log).
func (m *Manager) findTemplate(ctx context.Context, r *state.Record) (*usable, string) {
	if m.TemplateDir == nil {
		return nil, "templates are off"
	}
	be, ok := m.templater(r)
	if !ok {
		return nil, "only Debian (qemu backend) VMs start from templates"
	}
	none := fmt.Sprintf("no template for this VM's machine yet (hint: `agent-vm template build %s` makes one)", r.Slug)
	if _, found := template.Newest(m.TemplateDir.Path, ""); !found {
		return nil, none // without any template, skip hashing the key (agent-vm's binary among it)
	}
	k, err := m.templateKey(ctx, be, r)
	if err != nil {
		return nil, err.Error()
	}
	l, ok := template.Newest(m.TemplateDir.Path, k.Prefix())
	if !ok {
		return nil, none
	}
	slug := filepath.Base(l.Dir)
	rec, err := template.Read(l.Dir)
	if err != nil {
		return nil, fmt.Sprintf("the template %s is unreadable: %v (hint: `agent-vm template rm %s`)", l.Dir, err, slug)
	}
	tr, err := state.ReadRecord(l.Record())
	if err != nil {
		return nil, fmt.Sprintf("the template %s is unreadable: %v (hint: `agent-vm template rm %s`)", l.Dir, err, slug)
	}
	t := &usable{e: state.Entry{Slug: slug, Layout: l, Record: tr}, rec: rec}
	t.mach = m.machine(tr, l)
	return t, ""
}

// TemplateBuildResult says what template build did.
type TemplateBuildResult struct {
	Slug string
	Dir  string
	Took time.Duration
}

// BuildTemplate makes the template the VM of branch name fits (see
// internal/template): a cold boot of a template seed, then a suspend. An
// existing template for that key is refused (template rm first).
func (m *Manager) BuildTemplate(ctx context.Context, name string, o StartOptions) (*TemplateBuildResult, error) {
	e, err := m.findRecorded(ctx, name)
	if err != nil {
		return nil, err
	}
	r := e.Record
	be, ok := m.templater(r)
	if !ok {
		return nil, fmt.Errorf("VM %q uses the %s backend; only Debian (qemu backend) VMs start from templates", r.Branch, r.Backend)
	}
	k, err := m.templateKey(ctx, be, r)
	if err != nil {
		return nil, err
	}
	root, err := m.templateRoot()
	if err != nil {
		return nil, err
	}
	if l, ok := template.Newest(root.Dir, k.Prefix()); ok {
		return nil, fmt.Errorf("a template for VM %q's machine exists already: %s (hint: `agent-vm template rm %s` first to build it again)", r.Branch, l.Dir, filepath.Base(l.Dir))
	}
	slug := k.Prefix() + m.Now().UTC().Format("20060102t150405")
	began := time.Now()
	tm := m.forTemplates(root)
	if err := tm.createTemplate(ctx, be, r, slug); err != nil {
		return nil, err
	}
	l := root.Layout(slug)
	fail := func(err error) (*TemplateBuildResult, error) {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = tm.Stop(sctx, slug)
		if rerr := root.Remove(slug); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, fmt.Errorf("building the template: %w (nothing of it was kept)", err)
	}
	o.NoTemplate = true
	if _, err := tm.Start(ctx, slug, o); err != nil {
		return fail(err)
	}
	te, err := tm.findRecorded(ctx, slug)
	if err != nil {
		return fail(err)
	}
	site, err := tm.findBootID(ctx, te)
	if err != nil {
		m.Log.Warn("the template's clones will share its kernel boot id", "reason", err)
	}
	if _, err := tm.Suspend(ctx, slug); err != nil {
		return fail(err)
	}
	if err := template.Freeze(l.Dir); err != nil {
		return fail(err)
	}
	if err := template.Write(l.Dir, template.Record{Key: k, Built: m.Now().UTC(), For: r.Branch, BootID: site}); err != nil {
		return fail(err)
	}
	return &TemplateBuildResult{Slug: slug, Dir: l.Dir, Took: time.Since(began)}, nil
}

// createTemplate makes the template's VM directory (in m's root, the
// templates'): r's size, owner ids and CA choice, and the section r's
// backend be says; its own keys and token; an empty workspace owned by
// r's guest user.
func (m *Manager) createTemplate(ctx context.Context, be backend.Templater, r *state.Record, slug string) error {
	staging, err := m.Root.BeginCreate(slug)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			staging.Abort()
		}
	}()
	rec := &state.Record{
		Version: state.RecordVersion, ID: state.NewID(), Branch: slug, Slug: slug, VMName: "agent-vm-" + slug,
		Backend: r.Backend, CreatedAt: m.Now().UTC().Truncate(time.Second), Resources: r.Resources,
		Guest: state.Guest{User: guest.User, UID: r.Guest.UID, GID: r.Guest.GID, Proxy: true}, NoHostCA: r.NoHostCA,
	}
	section, err := be.TemplateSection(r)
	if err != nil {
		return err
	}
	if err := rec.SetSection(section); err != nil {
		return err
	}
	l := staging.Layout
	if err := makeDirs(l); err != nil {
		return err
	}
	if err := os.Mkdir(l.Workspace(), 0o700); err != nil {
		return err
	}
	if err := os.Chown(l.Workspace(), r.Guest.UID, r.Guest.GID); err != nil && os.Geteuid() == 0 {
		return err
	}
	if err := m.templatePorts(ctx, rec); err != nil {
		return err
	}
	if err := writeSecrets(l, rec); err != nil {
		return err
	}
	rec.Paths = m.Root.Layout(slug).Paths()
	if err := state.WriteRecord(l.Record(), rec); err != nil {
		return err
	}
	if _, err := staging.Commit(); err != nil {
		return err
	}
	committed = true
	return nil
}

// templatePorts picks the template's SSH and MCP ports among those no VM
// holds, in any registered state directory (the template runs only while
// it is built).
func (m *Manager) templatePorts(ctx context.Context, rec *state.Record) error {
	taken, err := m.Book().Taken()
	if err != nil {
		return err
	}
	for _, e := range m.listAll() {
		if e.Record != nil {
			taken[e.Record.Ports.SSH], taken[e.Record.Ports.MCP] = "a VM", "a VM"
		}
	}
	if rec.Ports.MCP, err = ports.Pick(ports.MCPRange(), taken, m.PortFree); err != nil {
		return err
	}
	taken[rec.Ports.MCP] = "the template"
	rec.Ports.SSH, err = ports.Pick(ports.SSHRange(), taken, m.PortFree)
	return err
}

// listAll lists the VMs of m's root (the templates') and of the VM
// root it was made from.
func (m *Manager) listAll() []state.Entry {
	var out []state.Entry
	for _, root := range []*state.Root{m.Root, m.vmRoot} {
		if root == nil {
			continue
		}
		if es, err := root.List(); err == nil {
			out = append(out, es...)
		}
	}
	return out
}

// Templates lists the templates.
func (m *Manager) Templates() ([]template.Info, error) {
	if m.TemplateDir == nil {
		return nil, nil
	}
	return template.List(m.TemplateDir.Path, m.disksInUse())
}

// RemoveTemplate removes a template (by its slug, or "all"). Its disk is
// kept, moved to the retired folder, while some VM's disk is made on it.
func (m *Manager) RemoveTemplate(ctx context.Context, slug string) error {
	all, err := m.Templates()
	if err != nil {
		return err
	}
	var picked []template.Info
	for _, t := range all {
		if slug == "all" || t.Slug == slug {
			picked = append(picked, t)
		}
	}
	if len(picked) == 0 {
		return fmt.Errorf("no template %q in %s (hint: `agent-vm template list` lists them)", slug, m.TemplateDir.Path)
	}
	root, err := m.templateRoot()
	if err != nil {
		return err
	}
	tm := m.forTemplates(root)
	used := m.disksInUse()
	for _, t := range picked {
		if !t.Ready && t.UsedBy > 0 && slug == "all" {
			continue // a removed template's disk that VMs still use
		}
		_, _ = tm.Stop(ctx, t.Slug) // a build that was cut short may run; stop discards a saved state
		lock, err := root.LockVM(ctx, t.Slug)
		if err != nil {
			return err
		}
		err = template.Retire(root, t, used)
		lock.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

// disksInUse are the disks the VMs' disks are made on (their backends'
// ImagesInUse).
func (m *Manager) disksInUse() map[string]bool {
	out := map[string]bool{}
	es, _ := m.Root.List()
	for _, e := range es {
		if e.Record == nil {
			continue
		}
		if be, ok := m.Backends[e.Record.Backend]; ok {
			for _, d := range be.ImagesInUse(e.Layout) {
				out[d] = true
			}
		}
	}
	return out
}

// startClone is a VM's first start from a template (see
// internal/template), after its backend prepared plan on the template's disk. A
// template the driver refuses, or a driver that is no driver.Cloner, is
// templateRefused: the caller boots cold.
func (m *Manager) startClone(ctx context.Context, e state.Entry, d driver.Driver, mach driver.Machine, plan *backend.Plan, t *usable, so driver.StartOptions, o StartOptions) (*StartResult, error) {
	r, l := e.Record, e.Layout
	cloner, ok := d.(driver.Cloner)
	if !ok {
		return nil, &templateRefused{fmt.Errorf("the %s driver cannot start a machine from a template: %w", d.Name(), driver.ErrUnsupported)}
	}
	o.Report.Report("starting from the template", 0, "")
	began := time.Now()
	var edits []driver.MemoryEdit
	if t.rec.BootID != nil {
		edit, id, err := template.BootIDEdit(t.rec.BootID)
		if err != nil {
			return nil, &templateRefused{fmt.Errorf("the template's boot id: %w", err)}
		}
		edits = append(edits, edit)
		m.Log.Debug("the clone's kernel boot id", "vm", r.Branch, "boot_id", id)
	} else {
		m.Log.Info("this VM shares its template's kernel boot id until it reboots: the template does not say where its kernel keeps it", "vm", r.Branch)
	}
	launch, err := cloner.Clone(ctx, mach, plan.Boot, so, t.mach, edits)
	if err != nil {
		if errors.Is(err, driver.ErrStaleState) {
			return nil, &templateRefused{err}
		}
		return nil, err
	}
	log := m.Log.With("vm", r.Branch)
	log.Debug("restored the template's machine", "after", time.Since(began))
	wctx, done := m.restoredWait(ctx, r.Slug, o.Timeout, cloneBase, d, mach, launch)
	defer done()
	res := &StartResult{FromTemplate: true}
	fail := func(phase string, err error) (*StartResult, error) {
		logs := d.Logs(mach)
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(sctx, mach, 0) // a half-made identity must not be left running
		return nil, &BootError{VM: r.Branch, Phase: phase, Err: fmt.Errorf("%w (the VM was stopped; `agent-vm reset --force %s` then `agent-vm start --no-template %s` boots it cold)", err, e.Slug, e.Slug),
			ConsoleLog: logs.Console, Tail: driver.TailFile(logs.Console, 15)}
	}
	// The guest is the template's until Personalize: its host key and
	// client key.
	kh := l.Run("template_known_hosts")
	pub, err := os.ReadFile(t.e.Layout.HostPubKey())
	if err != nil {
		return fail("reading the template's host key", err)
	}
	hk, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil {
		return fail("reading the template's host key", err)
	}
	if err := atomicfile.Write(kh, []byte(sshkeys.KnownHostsLine(r.Ports.SSH, hk)), 0o600); err != nil {
		return fail("writing the template's host key", err)
	}
	defer os.Remove(kh)
	tt := m.guestOf(r, l).Target()
	tt.KeyFile, tt.KnownHosts = t.e.Layout.ClientKey(), kh
	c, err := sshx.WaitReady(wctx, tt, nil)
	if err != nil {
		return fail("waiting for SSH after the restore", err)
	}
	log.Debug("ssh answers with the template's key", "after", time.Since(began))
	var errOut strings.Builder
	code, err := sshx.Run(wctx, c, "sudo -n sh -s", strings.NewReader(plan.Clone.Personalize), io.Discard, &errOut)
	c.Close()
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errOut.String()))
	}
	if err != nil {
		return fail("giving the guest its identity", err)
	}
	log.Debug("the guest has its identity", "after", time.Since(began))
	c, err = sshx.WaitReady(wctx, m.guestOf(r, l).Target(), nil)
	if err != nil {
		return fail("waiting for SSH with the VM's own keys", err)
	}
	c.Close()
	res.SSHReady = time.Since(began)
	m.Log.Debug("ssh ready", "after", res.SSHReady) // as start and resume log it (bench reads it)
	if err := d.MarkReady(mach, time.Now()); err != nil {
		m.Log.Warn("could not record that the VM is up", "error", err)
	}
	m.startHolder(e)
	if err := m.attachGuest(wctx, e, true); err != nil {
		return fail("mounting the workspace", err)
	}
	log.Debug("the workspace is mounted", "after", time.Since(began))
	o.Report.Report("finishing the guest's setup", time.Since(began), "")
	code, _, stderr, err := m.runRoot(wctx, e, func() string { return plan.Clone.FirstRun })
	if err == nil && code != 0 {
		m.Log.Warn("the VM's first-boot setup (agent CLI, provisioning) failed", "vm", r.Branch, "exit", code, "stderr", lastLines(stderr, 5))
	} else if err != nil {
		m.Log.Warn("the VM's first-boot setup (agent CLI, provisioning) could not run", "vm", r.Branch, "error", err)
	}
	if !guestctl.WaitHealthy(wctx, r.Ports.MCP) {
		m.Log.Warn("the VM started from its template, but agent-mcp does not answer yet", "vm", r.Branch)
		res.Info = m.Status(ctx, e, true)
		return res, nil
	}
	res.HealthReady = time.Since(began)
	if err := m.checkProvision(ctx, r, l); err != nil {
		return nil, err
	}
	m.waitHolder(ctx, e, 10*time.Second)
	res.Info = m.Status(ctx, e, true)
	return res, nil
}

// templateFor is the template a start of e uses: only a VM's first
// start (its backend has no disk for it yet), without --reprovision or
// --no-template, and only a template that fits. Why there is none is
// logged in one line.
func (m *Manager) templateFor(ctx context.Context, e state.Entry, o StartOptions) *usable {
	be, err := m.backendOf(e.Record, "start")
	if err != nil || be.ImagesInUse(e.Layout) != nil || m.TemplateDir == nil {
		return nil
	}
	if o.NoTemplate || o.Reprovision {
		m.Log.Info("booting cold, not from a template: --no-template or --reprovision", "vm", e.Record.Branch)
		return nil
	}
	t, why := m.findTemplate(ctx, e.Record)
	if t == nil {
		m.Log.Info("booting cold, not from a template: "+why, "vm", e.Record.Branch)
	}
	return t
}

// unclone undoes a start's disk made on a template the driver refused
// (the backend's Reset: a VM that never ran loses nothing) and prepares
// a cold boot instead.
func (m *Manager) unclone(ctx context.Context, e state.Entry, d driver.Driver, o StartOptions, share driver.ShareMode, mach *driver.Machine) (*backend.Plan, error) {
	be, err := m.backendOf(e.Record, "start")
	if err != nil {
		return nil, err
	}
	if err := be.Reset(ctx, e.Layout, e.Record); err != nil {
		return nil, err
	}
	if err := state.WriteRecord(e.Layout.Record(), e.Record); err != nil {
		return nil, err
	}
	return m.prepare(ctx, e, d, o, share, mach, "start", nil)
}

// templateRefused is a template the driver found not to fit this VM.
type templateRefused struct{ err error }

func (e *templateRefused) Error() string { return e.err.Error() }
func (e *templateRefused) Unwrap() error { return e.err }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// templateImages are the images the templates' disks are made on (image
// prune keeps them).
func (m *Manager) templateImages() map[string]bool {
	if m.TemplateDir == nil {
		return nil
	}
	root, err := m.templateRoot()
	if err != nil {
		return nil
	}
	return m.forTemplates(root).disksInUse()
}

// templateCheck is doctor's line about templates (template.Check).
func (m *Manager) templateCheck() backend.Check {
	ts, err := m.Templates()
	dir := ""
	if m.TemplateDir != nil {
		dir = m.TemplateDir.Path
	}
	return template.Check(dir, ts, err)
}

// findBootID asks a running template guest where its kernel keeps its
// boot id.
func (m *Manager) findBootID(ctx context.Context, e state.Entry) (*template.BootIDSite, error) {
	code, out, stderr, err := m.runRoot(ctx, e, func() string { return template.BootIDProbe })
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(stderr))
	}
	if err != nil {
		return nil, fmt.Errorf("asking the guest where its kernel keeps its boot id: %w", err)
	}
	return template.ParseBootIDProbe(out)
}
