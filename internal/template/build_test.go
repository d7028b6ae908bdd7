package template

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// refusingBuilder is the VMs of a build that must not get as far as a
// boot: any call fails the test.
type refusingBuilder struct{ t *testing.T }

func (b refusingBuilder) Start(context.Context, string) (state.Entry, error) {
	b.t.Error("the build booted a VM")
	return state.Entry{}, os.ErrInvalid
}
func (b refusingBuilder) Root(context.Context, state.Entry, string) (int, string, string, error) {
	return -1, "", "", os.ErrInvalid
}
func (b refusingBuilder) PullLog(context.Context, state.Entry, bool) (func(), error) {
	return nil, os.ErrInvalid
}
func (b refusingBuilder) Suspend(context.Context, string) error { return os.ErrInvalid }
func (b refusingBuilder) Stop(context.Context, string)          {}

// TestBuildRefusesAFullDisk: on a file system too small for the saved
// machine (a real 64 MiB tmpfs), a build is refused before anything is
// made, naming the space it needs and the way to free some; the template
// already there is untouched.
func TestBuildRefusesAFullDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		tu.SkipOrFail(t, "mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m,mode=0700"); err != nil {
		tu.SkipOrFail(t, "mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	root, err := state.Open(hostdir.Top(dir, 0o700, hostdir.InXDG))
	if err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "t-0123456789abcdef-20261101t000000")
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(old, Record{For: "feat", Agents: map[string]string{"claude": "2.1.332"}}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(old, File))
	from := &state.Record{Branch: "feat", Resources: state.Resources{CPUs: 2, MemoryMiB: 4096, DiskGiB: 16}}
	n := New{Site: Site{Root: root, Builder: refusingBuilder{t}}, From: from, Now: time.Now, Used: func() map[string]int { return nil }}
	_, err = build(context.Background(), n, Key{Contract: Contract}, hclog.NewNullLogger())
	if err == nil || !strings.Contains(err.Error(), "needs about 6144 MiB free in "+dir) || !strings.Contains(err.Error(), "template rm all") {
		t.Fatalf("got %v, want a refusal naming the space needed", err)
	}
	made, _ := filepath.Glob(filepath.Join(dir, "t-*"))
	if len(made) != 1 || made[0] != old {
		t.Errorf("the refused build left %v in the templates' directory", made)
	}
	if after, _ := os.ReadFile(filepath.Join(old, File)); string(after) != string(before) {
		t.Errorf("the template there was changed: %s", after)
	}
}

// Find picks, among a machine's templates, the newest that has all the
// VM's packages, else the newest (whose clone installs the rest).
func TestFindPrefersTheTemplateWithThePackages(t *testing.T) {
	dir := t.TempDir()
	k := Key{Contract: Contract}
	mk := func(built string, packages ...string) string {
		l := state.Layout{Dir: filepath.Join(dir, k.Prefix()+built)}
		if err := os.MkdirAll(l.Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := state.WriteRecord(l.Record(), &state.Record{Version: state.RecordVersion, ID: built, Branch: built, Slug: built, Ports: state.Ports{SSH: 2300, MCP: 8300}}); err != nil {
			t.Fatal(err)
		}
		if err := Write(l.Dir, Record{Key: k, For: built, Packages: packages}); err != nil {
			t.Fatal(err)
		}
		return filepath.Base(l.Dir)
	}
	withRG := mk("20261101t000000", "ripgrep", "jq")
	newest := mk("20261102t000000")
	for _, c := range []struct {
		want     []string
		template string
	}{
		{nil, newest},
		{[]string{"ripgrep"}, withRG},
		{[]string{"jq", "ripgrep"}, withRG},
		{[]string{"ripgrep", "fd-find"}, newest},
	} {
		f, why := Find(dir, k, "vm", c.want)
		if f == nil || f.Entry.Slug != c.template {
			t.Errorf("Find(packages %q) = %+v (%s), want %s", c.want, f, why, c.template)
		}
	}
	if f, why := Find(dir, Key{Contract: Contract, CPUs: 3}, "vm", nil); f != nil || !strings.Contains(why, "template build vm") {
		t.Errorf("another machine: %+v %q", f, why)
	}
	if !samePackages([]string{"a", "b"}, []string{"b", "a"}) || samePackages([]string{"a"}, []string{"a", "b"}) || !samePackages(nil, []string{}) {
		t.Error("samePackages")
	}
}

// List counts the VMs on a template's disk, and a retired template keeps
// that disk while any VM uses it.
func TestListCountsTheVMsOnATemplate(t *testing.T) {
	dir := t.TempDir()
	_, disk := aTemplate(t, dir)
	used := map[string]int{disk: 2, "/elsewhere/base.qcow2": 5}
	ts, err := list(dir, used)
	if err != nil || len(ts) != 1 || ts[0].UsedBy != 2 || !ts[0].Ready {
		t.Fatalf("List: %+v %v, want one ready template used by 2 VMs", ts, err)
	}
	if err := Retire(&state.Root{Dir: dir}, ts[0], used); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(disk); err != nil {
		t.Errorf("the retired template's disk, which VMs use, is gone: %v", err)
	}
	if ts, err := list(dir, used); err != nil || len(ts) != 1 || ts[0].Ready || ts[0].UsedBy != 2 {
		t.Errorf("after Retire: %+v %v, want its disk alone, used by 2 VMs", ts, err)
	}
}

// localVMs is the VMs of a state directory whose own VMs use no disk: a
// fake at the boundary to vm.Manager, answering DisksInUse only (any other
// call panics through the nil interface).
type localVMs struct{ VMs }

func (localVMs) DisksInUse() map[string]int { return map[string]int{} }

// TestADiskAnotherStateDirUsesIsKept: a template whose disk a VM of
// another state directory sharing the templates is made on (recorded in
// the template's directory as the backend makes that VM's disk) keeps its
// disk through a retirement here, where no VM uses it, until that VM's
// disk is gone.
func TestADiskAnotherStateDirUsesIsKept(t *testing.T) {
	dir := t.TempDir()
	tdir, disk := aTemplate(t, dir)
	overlay := filepath.Join(t.TempDir(), "other-state", "vm", "disk.qcow2")
	os.MkdirAll(filepath.Dir(overlay), 0o700)
	if err := os.WriteFile(overlay, []byte("overlay"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := image.MarkUser(disk, overlay); err != nil {
		t.Fatal(err)
	}
	tm := Templates{VMs: localVMs{}, Dir: &hostdir.Dir{Path: dir}}
	used := tm.disksInUse()
	if used[disk] != 1 {
		t.Fatalf("disks in use: %v, want %s used by the other directory's VM", used, disk)
	}
	ts, err := list(dir, used)
	if err != nil || len(ts) != 1 || ts[0].UsedBy != 1 {
		t.Fatalf("list: %+v %v, want one template used by 1 VM", ts, err)
	}
	if err := Retire(&state.Root{Dir: dir}, ts[0], used); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(disk); err != nil {
		t.Fatalf("the retired template's disk, which another state directory's VM uses, is gone: %v", err)
	}
	if used := tm.disksInUse(); used[disk] != 1 {
		t.Fatalf("after the template was retired, disks in use: %v, want %s still used by the other directory's VM", used, disk)
	}
	os.Remove(overlay) // that VM destroyed
	used = tm.disksInUse()
	if used[disk] != 0 {
		t.Fatalf("disks in use after the other VM went: %v", used)
	}
	ts, _ = list(dir, used)
	root, err := state.Open(&hostdir.Dir{Path: dir, Mode: 0o700, Place: hostdir.InXDG})
	if err != nil {
		t.Fatal(err)
	}
	if err := Retire(root, ts[0], used); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tdir); err == nil {
		t.Errorf("the template's directory stays once nothing uses its disk")
	}
}

// aTemplate makes a ready template in the templates' directory dir, with
// an empty disk; it returns the template's directory and disk.
func aTemplate(t *testing.T, dir string) (tdir, disk string) {
	t.Helper()
	k := Key{Contract: Contract}
	tdir = filepath.Join(dir, k.Prefix()+"20261101t000000")
	if err := os.MkdirAll(tdir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(tdir, Record{Key: k, For: "vm"}); err != nil {
		t.Fatal(err)
	}
	disk = filepath.Join(tdir, "disk.qcow2")
	if err := os.WriteFile(disk, nil, 0o400); err != nil {
		t.Fatal(err)
	}
	return tdir, disk
}
