package vm

import (
	"context"
	"fmt"
)

// The base images VMs boot are the host's (hostsetup.Host: `agent-vm
// image build|pull|list|prune`); the Manager says which its VMs and
// templates use.

// ImageDir is where base images are cached ("" in a Manager New made).
func (m *Manager) ImageDir() string { return m.Host.ImageDir() }

// imagesInUse are the images VMs' and templates' disks are made on, which
// image prune keeps (hostsetup.Host.InUse). A VM whose record is
// unreadable might use any version: an error, and nothing is removed.
func (m *Manager) imagesInUse(ctx context.Context) (map[string]bool, error) {
	entries, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, en := range entries {
		if en.Record == nil {
			return nil, fmt.Errorf("VM directory %s has an unreadable record, so agent-vm cannot tell which images it uses (hint: fix or destroy it first)", en.Layout.Dir)
		}
		be, ok := m.Backends[en.Record.Backend]
		if !ok {
			return nil, fmt.Errorf("VM %q uses the %s backend, which this agent-vm does not have, so it cannot tell which images that VM uses (hint: use an agent-vm build with that backend to prune)", en.Record.Branch, en.Record.Backend)
		}
		for _, img := range be.ImagesInUse(en.Layout) {
			used[img] = true
		}
	}
	for img := range m.templateImages() {
		used[img] = true
	}
	return used, nil
}
