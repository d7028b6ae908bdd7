package vm

// Templates (internal/template has their design and their commands): a
// template is a VM in the templates' state directory, which the template
// room's build drives through the Manager over that directory
// (TemplateSite); a VM's first start may clone one (clone.go).

import (
	"context"
	"errors"
	"fmt"
	"os"

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

// DefaultMachine is the record of the default machine: the VM `create`
// makes with no flags on this host (the default backend, size and image;
// the current user owns the workspace), which no directory holds; what
// `template build` with no branch and `setup --template` build a template
// for.
func (m *Manager) DefaultMachine(ctx context.Context) (*state.Record, error) {
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

// TemplateKey is the key of r's VM (template.NewKey) and the backend that
// makes its template, or why its VM starts from none.
func (m *Manager) TemplateKey(ctx context.Context, r *state.Record) (template.Key, backend.Templater, error) {
	be, ok := m.templater(r)
	if !ok {
		return template.Key{}, nil, fmt.Errorf("VM %q uses the %s backend; only Debian (qemu backend) VMs start from templates", r.Branch, r.Backend)
	}
	k, err := m.templateKey(ctx, be, r)
	return k, be, err
}

// TemplateSite is the templates' state directory, made on first use, and
// the Manager over it as the templates' commands drive it, its starts as
// boot says.
func (m *Manager) TemplateSite(boot template.Boot) (*template.Site, error) {
	root, err := m.templateRoot()
	if err != nil {
		return nil, err
	}
	tm := m.forTemplates(root)
	o := StartOptions{Timeout: boot.Timeout, Report: boot.Report, NoTemplate: true}
	return &template.Site{Root: root, VMs: m.Root, Book: tm.Book(), Builder: templateVMs{m: tm, o: o}}, nil
}

// TemplateCurrent is what a template built now would have: this guest
// contract, agent-vm binary and host CA certificates.
func (m *Manager) TemplateCurrent() template.Current {
	now := template.Current{Contract: template.Contract}
	if b, err := m.guestBinary(); err == nil {
		now.AgentVM = template.Hash(b)
	}
	if cas, err := m.HostCAs(); err == nil {
		now.CAs = template.CAsHash(cas)
	}
	return now
}

// TemplateStale is what the backend of the template's VM (record r, in l)
// finds older in it than a build now would make ("" when its backend
// makes no templates).
func (m *Manager) TemplateStale(ctx context.Context, l state.Layout, r *state.Record) string {
	if be, ok := m.Backends[r.Backend].(backend.Templater); ok {
		return be.TemplateStale(ctx, l, r)
	}
	return ""
}

// templateVMs is the Manager over the templates' directory as a build
// drives it (template.Builder), starting with o.
type templateVMs struct {
	m *Manager
	o StartOptions
}

func (t templateVMs) Start(ctx context.Context, slug string) (state.Entry, error) {
	if _, err := t.m.Start(ctx, slug, t.o); err != nil {
		return state.Entry{}, err
	}
	return t.m.Recorded(ctx, slug)
}

func (t templateVMs) Root(ctx context.Context, e state.Entry, script string) (int, string, string, error) {
	return t.m.runRoot(ctx, e, func() string { return script })
}

func (t templateVMs) PullLog(ctx context.Context, e state.Entry, follow bool) (func(), error) {
	return t.m.PullLog(ctx, e, follow)
}

func (t templateVMs) Suspend(ctx context.Context, slug string) error {
	_, err := t.m.Suspend(ctx, slug, SuspendOptions{Save: true}) // a template is a saved state
	return err
}

func (t templateVMs) Stop(ctx context.Context, slug string) { _, _ = t.m.Stop(ctx, slug) }

// DisksInUse are the disks the VMs' disks are made on (their backends'
// ImagesInUse), each with the number of VMs whose disks are.
func (m *Manager) DisksInUse() map[string]int {
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
	return m.forTemplates(root).DisksInUse()
}
