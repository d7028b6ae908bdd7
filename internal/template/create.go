package template

import (
	"context"
	"os"

	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/state"
)

// create makes the template's VM directory, slug, in n.Root: n.From's
// size, owner ids and CA choice (NewVMRecord) and n.Section; its own keys
// and token; an empty workspace owned by n.From's guest user.
func create(ctx context.Context, n New, slug string) error {
	r := n.From
	staging, err := n.Root.BeginCreate(slug)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			staging.Abort()
		}
	}()
	rec := NewVMRecord(r, slug, n.Now())
	for _, p := range n.Agents {
		rec.Agents = append(rec.Agents, p.String())
	}
	section, err := n.Section()
	if err != nil {
		return err
	}
	if err := rec.SetSection(section); err != nil {
		return err
	}
	l := staging.Layout
	if err := l.MakeDirs(); err != nil {
		return err
	}
	if err := os.Mkdir(l.Workspace(), 0o700); err != nil {
		return err
	}
	if err := os.Chown(l.Workspace(), r.Guest.UID, r.Guest.GID); err != nil && os.Geteuid() == 0 {
		return err
	}
	if err := pickPorts(n, rec); err != nil {
		return err
	}
	if err := state.WriteSecrets(l, rec); err != nil {
		return err
	}
	rec.Paths = n.Root.Layout(slug).Paths()
	if err := state.WriteRecord(l.Record(), rec); err != nil {
		return err
	}
	if _, err := staging.Commit(); err != nil {
		return err
	}
	committed = true
	return nil
}

// pickPorts picks the template's SSH and MCP ports among those no VM
// holds, in any registered state directory (the template runs only while
// it is built).
func pickPorts(n New, rec *state.Record) error {
	taken, err := n.Book.Taken()
	if err != nil {
		return err
	}
	for _, e := range listAll(n.Root, n.VMs) {
		if e.Record != nil {
			taken[e.Record.Ports.SSH], taken[e.Record.Ports.MCP] = "a VM", "a VM"
		}
	}
	if rec.Ports.MCP, err = ports.Pick(ports.MCPRange(), taken, n.Book.Free); err != nil {
		return err
	}
	taken[rec.Ports.MCP] = "the template"
	rec.Ports.SSH, err = ports.Pick(ports.SSHRange(), taken, n.Book.Free)
	return err
}

// listAll lists the VMs of the roots.
func listAll(roots ...*state.Root) []state.Entry {
	var out []state.Entry
	for _, root := range roots {
		if root == nil {
			continue
		}
		if es, err := root.List(); err == nil {
			out = append(out, es...)
		}
	}
	return out
}
