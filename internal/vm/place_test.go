package vm_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/hosts"
	"github.com/agent-vm/agent-vm/internal/libvirt"
	"github.com/agent-vm/agent-vm/internal/libvirtbackend"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// create --host places the VM on a registered host through the libvirt
// backend, and the record, status and `host rm` know it: a host of this
// machine's system libvirtd is taken; an unknown host, another backend, a
// session daemon and another machine whose link is not set up are refused before
// anything is made, each with a hint.
func TestCreateOnAHost(t *testing.T) {
	m := plainManager(t)
	m.Backends[libvirtbackend.Name] = &libvirtbackend.Backend{Run: execx.OS{}, Log: m.Log, ImageDir: t.TempDir()}
	m.Hosts = &hosts.Registry{Dir: &hostdir.Dir{Path: filepath.Join(t.TempDir(), "hosts"), Mode: 0o700}}
	ctx := context.Background()
	for name, uri := range map[string]string{"here": "qemu:///system", "big": "qemu+ssh://root@198.18.0.1/system", "mine": "qemu:///session"} {
		if _, err := m.Hosts.Add(ctx, name, uri); err != nil {
			t.Fatal(err)
		}
	}
	repo := tu.Repo(t, true)
	for _, tc := range []struct {
		o    vm.CreateOptions
		want string
	}{
		{vm.CreateOptions{Host: "nope"}, "nope"},
		{vm.CreateOptions{Host: "here", Backend: vm.BackendQEMU}, "--host here places the VM through libvirt, which the qemu backend does not use (hint:"},
		{vm.CreateOptions{Host: "mine"}, "is a session libvirtd"},
		{vm.CreateOptions{Host: "big"}, "reaches only over its own SSH link, not set up yet"},
	} {
		tc.o.Repo, tc.o.Branch = repo, "feat"
		_, err := m.Create(ctx, tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "hint") {
			t.Errorf("create %+v: %v, want %q", tc.o, err, tc.want)
		}
	}
	if es, _ := m.Root.List(); len(es) != 0 {
		t.Fatalf("refused creates left %d VMs", len(es))
	}
	r, err := m.Create(ctx, vm.CreateOptions{Repo: repo, Branch: "feat", Host: "here"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Host != "here" || r.Backend != libvirtbackend.Name {
		t.Errorf("record: host %q, backend %q", r.Host, r.Backend)
	}
	e, err := m.Find(ctx, r.Slug)
	if err != nil {
		t.Fatal(err)
	}
	if i := m.Status(ctx, e, false); i.Host != "here" || i.Backend != "libvirt" {
		t.Errorf("status: host %q, backend %q", i.Host, i.Backend)
	}
	if err := m.RemoveHost(ctx, "here"); err == nil || !strings.Contains(err.Error(), r.Slug) {
		t.Errorf("host rm with a VM on it: %v", err)
	}
	if err := m.RemoveHost(ctx, "big"); err != nil {
		t.Errorf("host rm of an unused host: %v", err)
	}
}

// A VM whose host is gone for good: destroy refuses, naming --force, and
// with --force forgets the VM here (nothing there can be asked), leaving
// no VM and no forward behind on this machine.
func TestDestroyOnAHostGone(t *testing.T) {
	m := plainManager(t)
	m.Backends[libvirtbackend.Name] = &libvirtbackend.Backend{Run: execx.OS{}, Log: m.Log, ImageDir: t.TempDir()}
	m.Drivers[libvirt.DriverName] = &libvirt.Driver{Run: execx.OS{}, Log: m.Log}
	hostsDir := filepath.Join(t.TempDir(), "hosts")
	m.Hosts = &hosts.Registry{Dir: &hostdir.Dir{Path: hostsDir, Mode: 0o700}}
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing answers there now
	if _, err := m.Hosts.Add(ctx, "here", "qemu:///system"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Hosts.Add(ctx, "gone", "qemu+ssh://root@"+addr+"/system"); err != nil {
		t.Fatal(err)
	}
	// The link as `host link` leaves it: a pinned host key, agent-vm's key.
	hostKey, err := sshkeys.Generate("gone's host key")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostsDir, "gone.known_hosts"), []byte(hostlink.PinLine(addr, hostKey.Public)), 0o600); err != nil {
		t.Fatal(err)
	}
	key, err := sshkeys.Generate("agent-vm host gone")
	if err != nil {
		t.Fatal(err)
	}
	if err := key.Write(filepath.Join(hostsDir, "gone.key")); err != nil {
		t.Fatal(err)
	}
	r, err := m.Create(ctx, vm.CreateOptions{Repo: tu.Repo(t, true), Branch: "feat", Host: "here"})
	if err != nil {
		t.Fatal(err)
	}
	// As if it had been placed on "gone" (which create refuses while the
	// host does not answer).
	l2 := m.Root.Layout(r.Slug)
	rec, err := state.ReadRecord(l2.Record())
	if err != nil {
		t.Fatal(err)
	}
	rec.Host = "gone"
	if err := state.WriteRecord(l2.Record(), rec); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Destroy(ctx, r.Slug, false); err == nil || !strings.Contains(err.Error(), "--force") || !strings.Contains(err.Error(), "host gone") {
		t.Fatalf("destroy of a VM whose host does not answer: %v, want a refusal naming the host and --force", err)
	}
	if es, _ := m.Root.List(); len(es) != 1 {
		t.Fatalf("the refused destroy removed the VM: %d left", len(es))
	}
	if _, err := m.Destroy(ctx, r.Slug, true); err != nil {
		t.Fatalf("destroy --force of a VM whose host is gone: %v", err)
	}
	if es, _ := m.Root.List(); len(es) != 0 {
		t.Errorf("destroy --force left %d VMs", len(es))
	}
}
