package vm

// Templates: a new branch's VM starts from a saved machine in
// seconds instead of booting and provisioning for a minute or more.
//
// A template is a VM of its own, kept in a state directory of its own
// (Manager.TemplateDir, under the cache directory: 0700 directories, 0600
// files, as every VM's): a record, its own throwaway client key, host key
// and MCP token, an empty workspace, a disk (an overlay on the base image)
// and the saved state of its machine. `agent-vm template build BRANCH`
// makes the one BRANCH's VM fits: it creates that VM, boots it cold with a
// template seed (the guest contract only: user dev, sshd, the agent-vm
// units, the proxy settings, the host's CA certificates; no workspace
// content, no agent CLI, no repository provisioning, no identity of any
// real VM), waits for cloud-init to finish, suspends it (internal/qemu's
// suspend path: the share unplugged, the state saved, the identity of
// QEMU, machine and disk recorded) and freezes its disk read-only.
//
// Which template a VM may start from is its key (templateKey): the
// backend, accelerator, size (CPUs, memory, disk), the workspace owner's
// uid/gid (dev's ids are baked in), the host CA certificates the guest
// trusts, the agent-vm binary the guest runs and the guest contract
// version; the directory is named after the key's hash. The rest is
// checked where it is known: the base image by the backend (the template's
// disk must be an overlay on the base this VM would boot), the QEMU
// version and the machine's command line by the driver (driver.Cloner).
//
// A VM's first start (its backend has no disk for it yet) uses the
// template when there is one that fits, unless StartOptions.NoTemplate:
// the backend makes the VM's disk on the template's (base <- template <-
// VM), the driver starts QEMU from the template's state with the VM's own
// ports, forwards, fw_cfg token and virtiofsd and writes the clone's own
// kernel boot id into its memory (bootid.go), then start logs in with the
// template's key and runs the backend's Personalize script, which hands
// the guest's agent-vm a plan (internal/personalize): the VM's host key
// and client key, the template's removed; a new machine-id; hostname;
// the instance-id, so that the VM's later cold boots with its own seed do
// not provision it again; the kernel RNG reseeded from the host on top of
// vmgenid; agent-mcp's settings and the VM's MCP token. It reconnects with
// the VM's pinned keys, mounts the workspace (resume's attach), and runs
// FirstRun (agent CLI, repository provisioning). From then on the VM is
// an ordinary one: later starts boot its own disk.
//
// Only a backend that says what of its record section a template takes
// and shares (a backend.Templater: the qemu backend), run by a driver that
// suspends and clones (driver.Suspender, driver.Cloner: QEMU's), has
// templates. Anything that does not fit falls back to the cold first
// boot, logged as one line with the reason: no template, another key, a
// NixOS guest, a different base or QEMU or machine, 9p instead of
// virtiofs.
//
// Why an explicit build rather than one made behind the user's back after
// the first cold boot: a template build is a whole extra boot (a minute
// alone under TCG, several on a busy 2-core host) competing with the VM
// the user is waiting for, and it keeps a disk and a RAM image (about the
// guest's memory) on disk; the user decides when that is worth it.
//
// A clone's kernel boot id (/proc/sys/kernel/random/boot_id), which the
// guest cannot change, is written into its memory by the driver before it
// runs (bootid.go): the build records where the template's kernel keeps
// it.
//
// A template's disk backs its clones' disks: `template rm` keeps it (alone
// in the template's directory, which is no template any more) while a
// VM's disk is made on it, and removes the rest; a later `template rm`
// removes it once no VM uses it. Each build has a directory of its own
// (the key's hash and the build time), so a rebuilt template never
// replaces a disk in use.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
)

// templateContract is the version of what a template's guest holds;
// change it whenever the template seed or Personalize changes what a
// clone's guest is, so that older templates are refused.
const templateContract = 2 // 2: template.json says where the kernel keeps its boot id; the guest's agent-vm personalizes

// Files of a template's directory besides a VM's.
const (
	templateFile = "template.json" // its key and when it was built
)

// templateKey is what a VM must share with a template to start from it.
type templateKey struct {
	Backend   string `json:"backend"`
	Accel     string `json:"accel"`
	CPUs      int    `json:"cpus"`
	MemoryMiB int    `json:"memory_mib"`
	DiskGiB   int    `json:"disk_gib"`
	UID       int    `json:"uid"`
	GID       int    `json:"gid"`
	NoHostCA  bool   `json:"no_host_ca"`
	CAs       string `json:"host_cas"`    // sha256 of the CA certificates the guest trusts
	AgentVM   string `json:"agent_vm"`    // sha256 of the agent-vm binary the guest runs
	Contract  int    `json:"contract"`    // templateContract
	Base      string `json:"base_config"` // the backend's section, less its per-VM counters
}

// prefix begins the names of the key's templates' directories
// ("t-<hash>-<build time>").
func (k templateKey) prefix() string {
	b, _ := json.Marshal(k)
	h := sha256.Sum256(b)
	return "t-" + hex.EncodeToString(h[:8]) + "-"
}

// templateRecord is template.json.
type templateRecord struct {
	Key   templateKey `json:"key"`
	Built time.Time   `json:"built"`
	// For is the branch whose VM the build was asked for.
	For string `json:"for"`
	// BootID is where the template's kernel keeps its boot id; nil when
	// the guest did not say (its clones then share the template's).
	BootID *bootIDSite `json:"boot_id,omitempty"`
}

// TemplateInfo describes one template (template list, doctor).
type TemplateInfo struct {
	Slug  string    `json:"slug"`
	Dir   string    `json:"dir"`
	For   string    `json:"for"`
	Built time.Time `json:"built"`
	Ready bool      `json:"ready"` // a template (else the disk of a removed one)
	Key   any       `json:"key,omitempty"`
	// UsedBy counts the VMs whose disks are made on its disk.
	UsedBy int `json:"used_by"`
}

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
func (m *Manager) templateKey(ctx context.Context, t backend.Templater, r *state.Record) (templateKey, error) {
	k := templateKey{Backend: r.Backend, Accel: m.Accel(ctx).Accel, CPUs: r.Resources.CPUs, MemoryMiB: r.Resources.MemoryMiB,
		DiskGiB: r.Resources.DiskGiB, UID: r.Guest.UID, GID: r.Guest.GID, NoHostCA: r.NoHostCA, Contract: templateContract}
	if !r.NoHostCA {
		cas, err := m.HostCAs()
		if err != nil {
			return k, err
		}
		k.CAs = hashOf([]byte(strings.Join(cas, "\x00")))
	}
	exe, err := m.executable()
	if err != nil {
		return k, err
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		return k, fmt.Errorf("reading the agent-vm binary the guest runs: %w", err)
	}
	k.AgentVM = hashOf(b)
	if k.Base, err = t.TemplateBase(r); err != nil {
		return k, err
	}
	return k, nil
}

func hashOf(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// executable is the agent-vm binary (Manager.Executable, else this one).
func (m *Manager) executable() (string, error) {
	if m.Executable != nil {
		return m.Executable()
	}
	return os.Executable()
}

// template is a usable template for a VM.
type template struct {
	e    state.Entry
	rec  templateRecord
	mach driver.Machine
}

// findTemplate returns the template r fits, or why there is none (one
// line, for the log).
func (m *Manager) findTemplate(ctx context.Context, r *state.Record) (*template, string) {
	if m.TemplateDir == nil {
		return nil, "templates are off"
	}
	be, ok := m.templater(r)
	if !ok {
		return nil, "only Debian (qemu backend) VMs start from templates"
	}
	none := fmt.Sprintf("no template for this VM's machine yet (hint: `agent-vm template build %s` makes one)", r.Slug)
	if _, found := newestTemplate(m.TemplateDir.Path, ""); !found {
		return nil, none // without any template, skip hashing the key (agent-vm's binary among it)
	}
	k, err := m.templateKey(ctx, be, r)
	if err != nil {
		return nil, err.Error()
	}
	l, ok := newestTemplate(m.TemplateDir.Path, k.prefix())
	if !ok {
		return nil, none
	}
	slug := filepath.Base(l.Dir)
	var rec templateRecord
	b, err := os.ReadFile(filepath.Join(l.Dir, templateFile))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		return nil, fmt.Sprintf("the template %s is unreadable: %v (hint: `agent-vm template rm %s`)", l.Dir, err, slug)
	}
	tr, err := state.ReadRecord(l.Record())
	if err != nil {
		return nil, fmt.Sprintf("the template %s is unreadable: %v (hint: `agent-vm template rm %s`)", l.Dir, err, slug)
	}
	t := &template{e: state.Entry{Slug: slug, Layout: l, Record: tr}, rec: rec}
	t.mach = m.machine(tr, l)
	return t, ""
}

// newestTemplate is the newest complete template (one with its
// template.json) whose directory name begins with prefix.
func newestTemplate(dir, prefix string) (state.Layout, bool) {
	found, _ := filepath.Glob(filepath.Join(dir, prefix+"*", templateFile))
	if len(found) == 0 {
		return state.Layout{}, false
	}
	slices.Sort(found) // the build time sorts as text
	return state.Layout{Dir: filepath.Dir(found[len(found)-1])}, true
}

// TemplateBuildResult says what template build did.
type TemplateBuildResult struct {
	Slug string
	Dir  string
	Took time.Duration
}

// BuildTemplate makes the template the VM of branch name fits (see the
// top of this file): a cold boot of a template seed, then a suspend. An
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
	if l, ok := newestTemplate(root.Dir, k.prefix()); ok {
		return nil, fmt.Errorf("a template for VM %q's machine exists already: %s (hint: `agent-vm template rm %s` first to build it again)", r.Branch, l.Dir, filepath.Base(l.Dir))
	}
	slug := k.prefix() + m.Now().UTC().Format("20060102t150405")
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
	if err := freezeDisks(l.Dir); err != nil {
		return fail(err)
	}
	rec := templateRecord{Key: k, Built: m.Now().UTC(), For: r.Branch, BootID: site}
	b, _ := json.MarshalIndent(rec, "", "  ")
	if err := atomicfile.Write(filepath.Join(l.Dir, templateFile), append(b, '\n'), 0o600); err != nil {
		return fail(err)
	}
	return &TemplateBuildResult{Slug: slug, Dir: l.Dir, Took: time.Since(began)}, nil
}

// freezeDisks makes the template's disks (its backend's qcow2 files)
// read-only: its clones' disks are made on them.
func freezeDisks(dir string) error {
	disks, err := filepath.Glob(filepath.Join(dir, "*.qcow2"))
	if err != nil {
		return err
	}
	for _, d := range disks {
		if err := os.Chmod(d, 0o400); err != nil {
			return err
		}
	}
	return nil
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
	taken, err := m.takenPorts()
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
func (m *Manager) Templates() ([]TemplateInfo, error) {
	if m.TemplateDir == nil {
		return nil, nil
	}
	entries, err := os.ReadDir(m.TemplateDir.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	used := m.disksInUse()
	var out []TemplateInfo
	for _, d := range entries {
		if !d.IsDir() || !strings.HasPrefix(d.Name(), "t-") {
			continue
		}
		dir := filepath.Join(m.TemplateDir.Path, d.Name())
		info := TemplateInfo{Slug: d.Name(), Dir: dir}
		var rec templateRecord
		if b, err := os.ReadFile(filepath.Join(dir, templateFile)); err == nil && json.Unmarshal(b, &rec) == nil {
			info.For, info.Built, info.Ready, info.Key = rec.For, rec.Built, true, rec.Key
		}
		for d := range used {
			if filepath.Dir(d) == dir {
				info.UsedBy++
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// RemoveTemplate removes a template (by its slug, or "all"). Its disk is
// kept, moved to the retired folder, while some VM's disk is made on it.
func (m *Manager) RemoveTemplate(ctx context.Context, slug string) error {
	all, err := m.Templates()
	if err != nil {
		return err
	}
	var picked []TemplateInfo
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
		err = retire(root, t, used)
		lock.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

// retire removes a template but for its disks that VMs' disks are made
// on (they name their backing file by its path): those stay in the
// template's directory, which is then no template any more (no
// template.json, no saved state, no keys), until no VM uses them.
func retire(root *state.Root, t TemplateInfo, used map[string]bool) error {
	var keep []string
	for d := range used {
		if filepath.Dir(d) == t.Dir {
			keep = append(keep, filepath.Base(d))
		}
	}
	if len(keep) == 0 {
		return root.Remove(t.Slug)
	}
	entries, err := os.ReadDir(t.Dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if slices.Contains(keep, e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(t.Dir, e.Name())); err != nil {
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

// startClone is a VM's first start from a template (see the top of this
// file), after its backend prepared plan on the template's disk. A
// template the driver refuses, or a driver that is no driver.Cloner, is
// templateRefused: the caller boots cold.
func (m *Manager) startClone(ctx context.Context, e state.Entry, d driver.Driver, mach driver.Machine, plan *backend.Plan, t *template, so driver.StartOptions, o StartOptions) (*StartResult, error) {
	r, l := e.Record, e.Layout
	cloner, ok := d.(driver.Cloner)
	if !ok {
		return nil, &templateRefused{fmt.Errorf("the %s driver cannot start a machine from a template: %w", d.Name(), driver.ErrUnsupported)}
	}
	o.Report.Report("starting from the template", 0, "")
	began := time.Now()
	var edits []driver.MemoryEdit
	if t.rec.BootID != nil {
		edit, id, err := bootIDEdit(t.rec.BootID)
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
	tt := sshTarget(r, l)
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
	c, err = sshx.WaitReady(wctx, sshTarget(r, l), nil)
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
	if !waitHealthy(wctx, r.Ports.MCP) {
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
func (m *Manager) templateFor(ctx context.Context, e state.Entry, o StartOptions) *template {
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

// templateCheck is doctor's line about templates: informational, new VMs
// boot without one.
func (m *Manager) templateCheck() backend.Check {
	c := backend.Check{Name: "templates", OK: true}
	ts, err := m.Templates()
	ready := 0
	for _, t := range ts {
		if t.Ready {
			ready++
		}
	}
	switch {
	case err != nil:
		c.Detail = "unreadable: " + err.Error()
	case ready == 0:
		c.Detail = "none: new VMs boot cold"
		c.Hint = "`agent-vm template build BRANCH` saves a machine that new VMs of its size start from in seconds"
	default:
		c.Detail = fmt.Sprintf("%d in %s (`agent-vm template list`)", ready, m.TemplateDir.Path)
	}
	return c
}
