package vm

// Templates (internal/template has their design): a template is a VM in
// the templates' state directory, which template.Build drives through the
// Manager over that directory; a VM's first start may clone one
// (clone.go).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
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
	t.Root = root
	t.WorkDir = "" // templates belong to no repository
	t.templates = true
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

// templateKey computes r's key (template.NewKey); t is r's backend.
func (m *Manager) templateKey(ctx context.Context, t backend.Templater, r *state.Record) (template.Key, error) {
	var cas []string
	if !r.NoHostCA {
		var err error
		if cas, err = m.HostCAs(); err != nil {
			return template.Key{}, err
		}
	}
	b, err := m.guestBinary()
	if err != nil {
		return template.Key{}, err
	}
	base, err := t.TemplateBase(r)
	if err != nil {
		return template.Key{}, err
	}
	return template.NewKey(r, m.Accel(ctx).Accel, cas, b, base), nil
}

// guestBinary is the agent-vm binary the guest runs (a template's key
// holds its hash).
func (m *Manager) guestBinary() ([]byte, error) {
	exe, err := m.executable()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		return nil, fmt.Errorf("reading the agent-vm binary the guest runs: %w", err)
	}
	return b, nil
}

// executable is the agent-vm binary (Manager.Executable, else this one).
func (m *Manager) executable() (string, error) {
	if m.Executable != nil {
		return m.Executable()
	}
	return os.Executable()
}

// BuildTemplate makes the template the VM of branch name fits, or, for
// name "", the default machine (what `create` and `run` make without size
// flags in a repository with no config), with the agent CLIs agentList
// names (guest.ParseAgentPins: "all", "none", or NAME[@VERSION],...)
// (template.Build drives the Manager over the templates' directory): a
// cold boot of a template seed, then a suspend. Once it is made, an
// older template of the same machine is retired (template.Remove: its
// disk stays while VMs' disks are made on it), so a rebuild replaces a
// template without breaking the VMs started from it.
func (m *Manager) BuildTemplate(ctx context.Context, name, agentList string, o StartOptions) (*template.BuildResult, error) {
	agents, err := guest.ParseAgentPins(agentList)
	if err != nil {
		return nil, err
	}
	var r *state.Record
	branch := "BRANCH" // the default machine is no VM's: the fixes name none
	if name == "" {
		if r, err = m.defaultMachine(ctx); err != nil {
			return nil, err
		}
	} else {
		e, err := m.findRecorded(ctx, name)
		if err != nil {
			return nil, err
		}
		r, branch = e.Record, e.Record.Slug
	}
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
	o.NoTemplate = true
	tm := m.forTemplates(root)
	n := template.New{Root: root, VMs: m.Root, Book: tm.Book(), From: r, Now: m.Now, Agents: agents, Used: m.disksInUse,
		Section: func() (any, error) { return be.TemplateSection(r) }}
	return template.Build(ctx, templateVMs{m: tm, o: o, branch: branch}, n, k, m.Log)
}

// defaultMachine is the record of the VM `create` makes with no flags on
// this host (the default backend, size and image; the current user owns
// the workspace), which no directory holds: what `template build` with no
// branch and `setup --template` build a template for.
func (m *Manager) defaultMachine(ctx context.Context) (*state.Record, error) {
	be, err := m.resolveBackend("")
	if err != nil {
		return nil, err
	}
	r := m.newRecord(CreateOptions{}, "default", "default", be.Name())
	r.Guest.UID, r.Guest.GID = os.Geteuid(), os.Getegid()
	if r.Guest.UID == 0 { // as create hands a root-owned workspace over
		if r.Guest.UID, r.Guest.GID, err = m.Host.Account(ctx); err != nil {
			return nil, err
		}
	}
	if err := be.Provision(ctx, state.Layout{}, r, backend.CreateFlags{}); err != nil {
		return nil, err
	}
	return r, nil
}

// templateVMs is the Manager over the templates' directory as a build
// drives it (template.Builder).
type templateVMs struct {
	m *Manager
	o StartOptions
	// branch is the VM the template is for, whose policy its first boot
	// has: the fixes of the proxy's refusals name it.
	branch string
}

func (t templateVMs) Start(ctx context.Context, slug string) error {
	if _, err := t.m.Start(ctx, slug, t.o); err != nil {
		return err
	}
	_, err := t.m.findRecorded(ctx, slug)
	return err
}

func (t templateVMs) BootID(ctx context.Context, slug string) (*template.BootIDSite, error) {
	e, err := t.m.findRecorded(ctx, slug)
	if err != nil {
		return nil, err
	}
	return t.m.findBootID(ctx, e)
}

func (t templateVMs) Agents(ctx context.Context, slug string, pins []guest.AgentPin) (map[string]string, error) {
	if len(pins) == 0 {
		return nil, nil
	}
	e, err := t.m.findRecorded(ctx, slug)
	if err != nil {
		return nil, err
	}
	code, out, stderr, err := t.m.runRoot(ctx, e, func() string { return template.AgentProbe(pins) })
	if err == nil && code != 0 {
		// The first boot installed them: all the template VM's log is
		// since.
		err = netpolicy.WithRefusals(ctx, t.m, e, t.branch, time.Time{}, errors.New(strings.TrimSpace(stderr)))
	}
	if err != nil {
		return nil, err
	}
	versions, err := template.ParseAgentProbe(out, pins)
	if err == nil && slices.ContainsFunc(pins, func(p guest.AgentPin) bool { return p.Name == "claude" }) {
		t.devToolsMCP(ctx, e)
	}
	return versions, err
}

// devToolsMCP installs chrome-devtools-mcp in a template with Claude Code,
// so its clones' `browser --cdp` finds it (the install script does nothing
// where the pinned versions are there). A failure costs the template
// nothing else: a clone installs it at its first --cdp, and the warning
// says so.
func (t templateVMs) devToolsMCP(ctx context.Context, e state.Entry) {
	d, err := guest.NewDevToolsMCP(guest.DevToolsMCPPrefix, runtime.GOARCH) // the guest's architecture is the host's
	if err == nil {
		var code int
		var stderr string
		began := time.Now()
		code, _, stderr, err = t.m.runRoot(ctx, e, func() string { return d.Install() })
		if err == nil && code != 0 {
			err = netpolicy.WithRefusals(ctx, t.m, e, t.branch, began, fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(stderr)))
		}
	}
	if err != nil {
		t.m.Log.Warn("the template has no chrome-devtools-mcp; a VM from it installs it at its first `agent-vm browser --cdp`", "error", err)
	}
}

func (t templateVMs) Suspend(ctx context.Context, slug string) error {
	_, err := t.m.Suspend(ctx, slug, SuspendOptions{Save: true}) // a template is a saved state
	return err
}

func (t templateVMs) Stop(ctx context.Context, slug string) { _, _ = t.m.Stop(ctx, slug) }

// Templates lists the templates, each with what makes it older than one
// built now would be (Info.Stale).
func (m *Manager) Templates(ctx context.Context) ([]template.Info, error) {
	if m.TemplateDir == nil {
		return nil, nil
	}
	ts, err := template.List(m.TemplateDir.Path, m.disksInUse())
	if err != nil || len(ts) == 0 {
		return ts, err
	}
	now := template.Current{Contract: template.Contract}
	if b, err := m.guestBinary(); err == nil {
		now.AgentVM = template.Hash(b)
	}
	if cas, err := m.HostCAs(); err == nil {
		now.CAs = template.CAsHash(cas)
	}
	for i, t := range ts {
		if !t.Ready {
			continue
		}
		var backendSays string
		if tr, err := state.ReadRecord(state.Layout{Dir: t.Dir}.Record()); err == nil {
			if be, ok := m.Backends[tr.Backend].(backend.Templater); ok {
				backendSays = be.TemplateStale(ctx, state.Layout{Dir: t.Dir}, tr)
			}
		}
		ts[i].Stale = now.Stale(t, backendSays)
	}
	return ts, nil
}

// RemoveTemplate removes a template (by its slug, or "all"; see
// template.Remove). Its disk is kept while some VM's disk is made on it.
func (m *Manager) RemoveTemplate(ctx context.Context, slug string) error {
	all, err := m.Templates(ctx)
	if err != nil {
		return err
	}
	picked := template.Pick(all, slug)
	if len(picked) == 0 {
		return fmt.Errorf("no template %q in %s (hint: `agent-vm template list` lists them)", slug, m.TemplateDir.Path)
	}
	root, err := m.templateRoot()
	if err != nil {
		return err
	}
	tm := m.forTemplates(root)
	return template.Remove(ctx, root, picked, slug == "all", m.disksInUse(), func(ctx context.Context, slug string) { _, _ = tm.Stop(ctx, slug) })
}

// disksInUse are the disks the VMs' disks are made on (their backends'
// ImagesInUse), each with the number of VMs whose disks are.
func (m *Manager) disksInUse() map[string]int {
	out := map[string]int{}
	es, _ := m.Root.List()
	for _, e := range es {
		if e.Record == nil {
			continue
		}
		if be, ok := m.Backends[e.Record.Backend]; ok {
			for _, d := range be.ImagesInUse(e.Layout) {
				out[d]++
			}
		}
	}
	return out
}

// templateImages are the images the templates' disks are made on (image
// prune keeps them).
func (m *Manager) templateImages() map[string]int {
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
func (m *Manager) templateCheck(ctx context.Context) backend.Check {
	ts, err := m.Templates(ctx)
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

// CurrentTemplate is the default machine's template when one holds the
// agent CLIs agentList names at the versions asked for and is not older
// than a build now would be: its slug, or "" (setup --template then
// builds).
func (m *Manager) CurrentTemplate(ctx context.Context, agentList string) string {
	agents, err := guest.ParseAgentPins(agentList)
	if err != nil || m.TemplateDir == nil {
		return ""
	}
	r, err := m.defaultMachine(ctx)
	if err != nil {
		return ""
	}
	be, ok := m.templater(r)
	if !ok {
		return ""
	}
	k, err := m.templateKey(ctx, be, r)
	if err != nil {
		return ""
	}
	ts, err := m.Templates(ctx)
	if err != nil {
		return ""
	}
	return template.CurrentOf(ts, k.Prefix(), agents)
}
