package debian

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// Without --image, create already knows the base the first start will use
// (the built default, 4 GiB, when there is none yet): a smaller --disk is
// refused now, not at every start.
func TestProvisionRefusesADiskSmallerThanTheDefaultImage(t *testing.T) {
	b := &Backend{Run: execx.OS{}, ImageDir: t.TempDir()}
	for disk, want := range map[int]string{3: "--disk 3G is smaller than the default base image (4 GiB) (hint: leave --disk out, or give at least 4G)", 4: "", 20: ""} {
		err := b.Provision(context.Background(), state.Layout{Dir: t.TempDir()}, &state.Record{Resources: state.Resources{DiskGiB: disk}}, backend.CreateFlags{})
		if got := ""; err != nil {
			got = err.Error()
			if want == "" || !strings.Contains(got, want) {
				t.Errorf("--disk %dG: got %q, want %q", disk, got, want)
			}
		} else if want != "" {
			t.Errorf("--disk %dG: no error, want %q", disk, want)
		}
	}
}

// Packages are checked against Debian's grammar at create, naming the bad one.
func TestCheckCreateChecksPackageNames(t *testing.T) {
	b := &Backend{}
	if err := b.CheckCreate(backend.CreateFlags{Packages: []string{"ripgrep", "g++", "python3.11-venv"}}); err != nil {
		t.Errorf("valid Debian names refused: %v", err)
	}
	for _, bad := range []string{"Ripgrep", "-y", "a", "rip grep", "python3Packages"} {
		err := b.CheckCreate(backend.CreateFlags{Packages: []string{"jq", bad}})
		if err == nil || !strings.Contains(err.Error(), `"`+bad+`" is not a Debian package name`) {
			t.Errorf("%q: got %v", bad, err)
		}
	}
}

// Reset refuses when no base image could make a fresh disk, leaving the VM
// as it was; otherwise it removes the overlay and bumps the instance-id.
func TestReset(t *testing.T) {
	l := state.Layout{Dir: t.TempDir()}
	for _, f := range []string{DiskFile, DiskInfoFile} {
		os.WriteFile(filepath.Join(l.Dir, f), []byte("x"), 0o600)
	}
	r := &state.Record{Branch: "feat", Backend: Name}
	r.SetSection(Settings{Provision: 2})
	b := &Backend{Run: execx.OS{}, ImageDir: t.TempDir()}
	err := b.Reset(context.Background(), l, r)
	if err == nil || !strings.Contains(err.Error(), "no base image") || !strings.Contains(err.Error(), "sudo agent-vm image build") {
		t.Fatalf("reset without a base image: %v", err)
	}
	if _, err := os.Stat(filepath.Join(l.Dir, DiskFile)); err != nil {
		t.Errorf("a refused reset touched the disk: %v", err)
	}
	r.SetSection(Settings{Image: filepath.Join(t.TempDir(), "gone.qcow2"), Provision: 2})
	if err := b.Reset(context.Background(), l, r); err == nil || !strings.Contains(err.Error(), "the VM is unchanged") {
		t.Errorf("reset with a missing --image: %v", err)
	}

	// A raw disk with an MBR: a base image as far as Inspect can tell.
	testutil.Program(t, "qemu-img")
	mbr := make([]byte, 1<<20)
	mbr[510], mbr[511] = 0x55, 0xaa
	base := filepath.Join(t.TempDir(), "base.raw")
	os.WriteFile(base, mbr, 0o644)
	r.SetSection(Settings{Image: base, Provision: 2})
	if err := b.Reset(context.Background(), l, r); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{DiskFile, DiskInfoFile} {
		if _, err := os.Stat(filepath.Join(l.Dir, f)); !os.IsNotExist(err) {
			t.Errorf("%s is still there after reset: %v", f, err)
		}
	}
	if s, _ := state.SectionOf[Settings](r); s.Provision != 3 || s.Image != base {
		t.Errorf("settings after reset: %+v, want provision 3 (a new instance-id) and the image kept", s)
	}
}

// --box and --vagrantfile belong to the vagrant backend: the qemu backend
// refuses them, naming it, and takes --vagrantfile's default.
func TestBoxFlagBelongsToVagrant(t *testing.T) {
	if err := (&Backend{}).CheckCreate(backend.CreateFlags{Box: "x/y"}); err == nil || !strings.Contains(err.Error(), "--backend vagrant") {
		t.Errorf("qemu backend with --box: %v", err)
	}
	if err := (&Backend{}).CheckCreate(backend.CreateFlags{Vagrantfile: "repo"}); err == nil || !strings.Contains(err.Error(), "--backend vagrant") {
		t.Errorf("qemu backend with --vagrantfile=repo: %v", err)
	}
	if err := (&Backend{}).CheckCreate(backend.CreateFlags{Vagrantfile: "auto"}); err != nil {
		t.Errorf("qemu backend with --vagrantfile's default: %v", err)
	}
}

// An agent whose pinned release needs a newer Node.js than the Debian
// guest's is refused at create, naming the versions; the others pass.
func TestCheckCreateRefusesAnAgentTheGuestCannotRun(t *testing.T) {
	b := &Backend{}
	if err := b.CheckCreate(backend.CreateFlags{Agent: "gemini"}); err == nil || !strings.Contains(err.Error(), "needs Node.js 20 or newer") || !strings.Contains(err.Error(), "Node.js 18") {
		t.Errorf("--agent gemini: %v", err)
	}
	for _, a := range []string{"", "claude", "codex"} {
		if err := b.CheckCreate(backend.CreateFlags{Agent: a}); err != nil {
			t.Errorf("--agent %q: %v", a, err)
		}
	}
}

// An --image that is the disk of one of agent-vm's own images (here named
// through a link, as the cache's current-version link names it) boots
// with that image's kernel, initrd and command line, by the version's own
// paths; any other disk boots by its own boot loader.
func TestBaseOfAnAgentVMImageHasItsKernel(t *testing.T) {
	testutil.Program(t, "qemu-img")
	cache := t.TempDir()
	version := filepath.Join(cache, ".store", "debian-bookworm", "20261201T000000Z")
	if err := os.MkdirAll(version, 0o755); err != nil {
		t.Fatal(err)
	}
	manifest := `{"schema":1,"name":"debian-bookworm","kind":"built","disk":"disk.qcow2","format":"qcow2","kernel":"vmlinuz","initrd":"initrd.img","cmdline":"root=/dev/vda rw"}`
	for name, content := range map[string]string{image.ManifestFile: manifest, "disk.qcow2": "", "vmlinuz": "", "initrd.img": ""} {
		if err := os.WriteFile(filepath.Join(version, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(cache, "debian-bookworm")
	if err := os.Symlink(filepath.Join(".store", "debian-bookworm", "20261201T000000Z"), link); err != nil {
		t.Fatal(err)
	}
	b := &Backend{Run: execx.OS{}, ImageDir: t.TempDir()}
	got, err := b.base(context.Background(), Settings{Image: filepath.Join(link, "disk.qcow2")}, backend.PrepareOptions{})
	want := DiskInfo{Base: filepath.Join(version, "disk.qcow2"), BaseFormat: "qcow2", Kernel: filepath.Join(version, "vmlinuz"),
		Initrd: filepath.Join(version, "initrd.img"), Cmdline: "root=/dev/vda rw"}
	if err != nil || *got != want {
		t.Errorf("base of an agent-vm image's disk: %+v, %v; want %+v", got, err, want)
	}

	// A version whose kernel is gone is refused, named, not booted without it.
	if err := os.Remove(filepath.Join(version, "vmlinuz")); err != nil {
		t.Fatal(err)
	}
	if got, err := b.base(context.Background(), Settings{Image: filepath.Join(link, "disk.qcow2")}, backend.PrepareOptions{}); err == nil || !strings.Contains(err.Error(), "is damaged") || !strings.Contains(err.Error(), "vmlinuz") {
		t.Errorf("base of an image version without its kernel: %+v, %v; want it refused as damaged, naming the kernel", got, err)
	}

	// A disk of another's (a raw disk with an MBR) has no kernel beside it.
	mbr := make([]byte, 1<<20)
	mbr[510], mbr[511] = 0x55, 0xaa
	other := filepath.Join(t.TempDir(), "base.raw")
	if err := os.WriteFile(other, mbr, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = b.base(context.Background(), Settings{Image: other}, backend.PrepareOptions{})
	if err != nil || *got != (DiskInfo{Base: other, BaseFormat: "raw"}) {
		t.Errorf("base of another disk: %+v, %v; want it alone, raw", got, err)
	}
}
