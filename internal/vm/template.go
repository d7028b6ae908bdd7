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
	"strings"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
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
	exe, err := m.executable()
	if err != nil {
		return template.Key{}, err
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		return template.Key{}, fmt.Errorf("reading the agent-vm binary the guest runs: %w", err)
	}
	base, err := t.TemplateBase(r)
	if err != nil {
		return template.Key{}, err
	}
	return template.NewKey(r, m.Accel(ctx).Accel, cas, b, base), nil
}

// executable is the agent-vm binary (Manager.Executable, else this one).
func (m *Manager) executable() (string, error) {
	if m.Executable != nil {
		return m.Executable()
	}
	return os.Executable()
}

// BuildTemplate makes the template the VM of branch name fits
// (template.Build drives the Manager over the templates' directory): a
// cold boot of a template seed, then a suspend.
func (m *Manager) BuildTemplate(ctx context.Context, name string, o StartOptions) (*template.BuildResult, error) {
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
	o.NoTemplate = true
	tm := m.forTemplates(root)
	n := template.New{Root: root, VMs: m.Root, Book: tm.Book(), From: r, Now: m.Now,
		Section: func() (any, error) { return be.TemplateSection(r) }}
	return template.Build(ctx, templateVMs{m: tm, o: o}, n, k, m.Log)
}

// templateVMs is the Manager over the templates' directory as a build
// drives it (template.Builder).
type templateVMs struct {
	m *Manager
	o StartOptions
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

func (t templateVMs) Suspend(ctx context.Context, slug string) error {
	_, err := t.m.Suspend(ctx, slug, SuspendOptions{Save: true}) // a template is a saved state
	return err
}

func (t templateVMs) Stop(ctx context.Context, slug string) { _, _ = t.m.Stop(ctx, slug) }

// Templates lists the templates.
func (m *Manager) Templates() ([]template.Info, error) {
	if m.TemplateDir == nil {
		return nil, nil
	}
	return template.List(m.TemplateDir.Path, m.disksInUse())
}

// RemoveTemplate removes a template (by its slug, or "all"; see
// template.Remove). Its disk is kept while some VM's disk is made on it.
func (m *Manager) RemoveTemplate(ctx context.Context, slug string) error {
	all, err := m.Templates()
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
