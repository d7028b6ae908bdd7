package vm_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/libvirtbackend"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/wire"
)

// image prune asks each VM's backend which cached images it uses: a
// replaced image version a qemu VM's disk is based on stays, and so does
// the one a libvirt VM's disk was made on; one nothing uses goes; a VM of a backend this build lacks stops the prune.
func TestPruneImagesKeepsWhatBackendsUse(t *testing.T) {
	cache := t.TempDir()
	m, err := wire.Open(wire.Config{StateDir: t.TempDir(), Getenv: func(k string) string {
		return map[string]string{"XDG_CACHE_HOME": cache, "HOME": t.TempDir()}[k]
	}})
	if err != nil {
		t.Fatal(err)
	}
	images := m.ImageDir()
	version := func(v string) string {
		d := filepath.Join(images, ".store", "img", v)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, image.ManifestFile), []byte(`{"schema":1,"name":"img","kind":"built","disk":"disk.qcow2","format":"qcow2"}`), 0o644)
		os.WriteFile(filepath.Join(d, "disk.qcow2"), []byte("disk"), 0o644)
		return d
	}
	unused, used, byLibvirt := version("20260101T000000Z"), version("20260102T000000Z"), version("20260103T000000Z")
	version("20260201T000000Z")
	os.Symlink(filepath.Join(".store", "img", "20260201T000000Z"), filepath.Join(images, "img"))

	vmDir := func(slug, backend string) state.Layout {
		l := m.Root.Layout(slug)
		os.MkdirAll(l.Dir, 0o700)
		r := &state.Record{Version: state.RecordVersion, ID: state.NewID(), Branch: slug, Slug: slug, MachineName: "agent-vm-" + slug,
			Backend: backend, Ports: state.Ports{SSH: 2222, MCP: 8000}}
		if err := state.WriteRecord(l.Record(), r); err != nil {
			t.Fatal(err)
		}
		return l
	}
	q := vmDir("q", "qemu")
	os.WriteFile(filepath.Join(q.Dir, debian.DiskInfoFile), []byte(`{"base":"`+filepath.Join(used, "disk.qcow2")+`","base_format":"qcow2"}`), 0o600)
	vmDir("n", "nixos")
	lv := vmDir("l", "libvirt")
	r, err := state.ReadRecord(lv.Record())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetSection(libvirtbackend.Settings{Image: byLibvirt}); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteRecord(lv.Record(), r); err != nil {
		t.Fatal(err)
	}

	removed, err := m.Host.PruneImages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != unused {
		t.Errorf("removed %q, want only %s", removed, unused)
	}
	if _, err := os.Stat(filepath.Join(used, "disk.qcow2")); err != nil {
		t.Errorf("the version the qemu VM uses was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(byLibvirt, "disk.qcow2")); err != nil {
		t.Errorf("the version the libvirt VM's disk was made on was removed: %v", err)
	}

	vmDir("v", "vmware")
	if _, err := m.Host.PruneImages(context.Background()); err == nil || !strings.Contains(err.Error(), "vmware backend") {
		t.Errorf("prune with a VM of an unknown backend: %v, want a refusal naming it", err)
	}
}
