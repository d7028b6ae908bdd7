package vagrant

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
)

// sample is a Vagrantfile with every path under root; under TCG (drv
// qemu) it gives agent-vm's own box's kernel its command line, as SpecOf
// does.
func sample(root string, drv string) Vagrantfile {
	v := sampleOf(root, drv)
	if drv == DomainQEMU {
		v.Cmdline = accel.KernelCmdline(accel.TCG, "root=/dev/vda rw console=ttyS0,115200")
	}
	return v
}

// sampleOf is sample without a kernel command line of its own.
func sampleOf(root string, drv string) Vagrantfile {
	return Vagrantfile{Name: "agent-vm-feat-x-0123abcd", Box: "agent-vm/debian-12", BoxVersion: "1767322800.305419896", Guest: "debian", CPUs: 2, MemoryMiB: 4096, Driver: drv, URI: DefaultURI,
		Share:    root + "/feat-x/run/virtiofsd.sock",
		Forwards: []Forward{{ID: "ssh", Host: 2201, Guest: 22}, {ID: "mcp", Host: 8000, Guest: 8000}},
		SSH:      SSH{User: "dev", KeyFile: root + "/feat-x/ssh/id_ed25519"}, MAC: "52:54:00:ab:cd:ef",
		Seed: root + "/feat-x/seed.iso", Console: root + "/feat-x/logs/console.log",
		FwCfg:       []FwCfg{{Name: "opt/io.systemd.credentials/agent-vm.mcp-token", File: root + "/feat-x/run/fw_cfg/agent-vm.mcp-token"}},
		BootTimeout: 900}
}

var goldens = []struct {
	name string
	drv  string
}{
	{"kvm", DomainKVM},
	{"tcg", DomainQEMU},
}

const placeholder = "/STATE"

func TestVagrantfileGolden(t *testing.T) {
	for _, g := range goldens {
		t.Run(g.name, func(t *testing.T) {
			b, err := Render(sample(placeholder, g.drv))
			if err != nil {
				t.Fatal(err)
			}
			testutil.Golden(t, filepath.Join("testdata", g.name+".golden"), b)
		})
	}
}

// TestSpecOfGivesTCGsKernelParameters: under TCG, agent-vm's own box
// (which boots the image's kernel directly) gets its command line with
// accel's TCG parameters; under KVM, and for a box with a bootloader of
// its own (no command line known), the Vagrantfile sets none.
func TestSpecOfGivesTCGsKernelParameters(t *testing.T) {
	m := driver.Machine{Name: "agent-vm-feat-x", UUID: "0123abcd-0000-4000-8000-000000000000", CPUs: 2, MemoryMiB: 2048, RunDir: "/STATE/run", LogsDir: "/STATE/logs"}
	own := Boot{Box: "agent-vm/debian-bookworm", Cmdline: "root=/dev/vda rw console=ttyS0,115200", SSHUser: "dev", SSHKey: "/STATE/key"}
	other := own
	other.Box, other.Cmdline = "debian/bookworm64", ""
	for _, c := range []struct {
		name  string
		boot  Boot
		accel string
		want  string
	}{
		{"own box, tcg", own, accel.TCG, "root=/dev/vda rw console=ttyS0,115200 " + accel.TCGKernelParams},
		{"own box, kvm", own, accel.KVM, ""},
		{"a bootloader's box, tcg", other, accel.TCG, ""},
	} {
		v := SpecOf(m, c.boot, driver.StartOptions{Accel: c.accel, Share: driver.ShareVirtiofs}, DefaultURI)
		if v.Cmdline != c.want {
			t.Errorf("%s: the Vagrantfile's kernel command line is %q, want %q", c.name, v.Cmdline, c.want)
		}
		b, err := Render(v)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := strings.Contains(string(b), "libvirt.cmd_line"); got != (c.want != "") {
			t.Errorf("%s: libvirt.cmd_line in the Vagrantfile: %v, want %v:\n%s", c.name, got, c.want != "", b)
		}
	}
}

func TestRenderRefuses(t *testing.T) {
	for name, mut := range map[string]func(*Vagrantfile){
		"xml quote in seed": func(v *Vagrantfile) { v.Seed = "/a'b/seed.iso" },
		"xml in cmdline":    func(v *Vagrantfile) { v.Cmdline = "root=/dev/vda <x>" },
		"ampersand console": func(v *Vagrantfile) { v.Console = "/a&b/console.log" },
		"driver":            func(v *Vagrantfile) { v.Driver = "xen" },
		"no share":          func(v *Vagrantfile) { v.Share = "" },
		"quote in socket":   func(v *Vagrantfile) { v.Share = "/a\"b/virtiofsd.sock" },
		"size":              func(v *Vagrantfile) { v.CPUs = 0 },
		"no box":            func(v *Vagrantfile) { v.Box = "" },
		"machine name":      func(v *Vagrantfile) { v.Name = "a b" },
		"port":              func(v *Vagrantfile) { v.Forwards[0].Host = 70000 },
	} {
		v := sample("/s", DomainKVM)
		mut(&v)
		if _, err := Render(v); err == nil {
			t.Errorf("%s: rendered", name)
		}
	}
}

// recorder is Ruby that loads a Vagrantfile with a stand-in Vagrant whose
// config records every string argument, and prints them in hex, one a
// line: what the file's literals evaluate to.
const recorder = `
$out = []
class Rec
  def method_missing(name, *args, **kw, &blk)
    (args + kw.values).flatten.each { |a| $out << a if a.is_a?(String) }
    kw.each_value { |h| h.each_value { |x| $out << x if x.is_a?(String) } if h.is_a?(Hash) }
    blk.call(Rec.new) if blk
    Rec.new
  end
  def respond_to_missing?(*) = true
end
module Vagrant
  def self.configure(_v) = yield(Rec.new)
end
load ARGV[0]
STDOUT.write($out.map { |s| s.b.unpack1("H*") }.join("\n"))
`

// literals evaluates the Vagrantfile b with real Ruby and returns the
// strings its literals evaluate to.
func literals(t testing.TB, ruby string, b []byte) []string {
	dir := t.TempDir()
	vf, rec := filepath.Join(dir, "Vagrantfile"), filepath.Join(dir, "rec.rb")
	testutil.WriteFile(t, vf, string(b))
	testutil.WriteFile(t, rec, recorder)
	out, err := exec.Command(ruby, rec, vf).CombinedOutput()
	if err != nil {
		t.Fatalf("ruby could not load the Vagrantfile: %v\n%s\n--- Vagrantfile:\n%s", err, out, b)
	}
	var got []string
	for _, h := range strings.Split(string(out), "\n") {
		s, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("recorder output %q: %v", h, err)
		}
		got = append(got, string(s))
	}
	return got
}

// FuzzVagrantfileLiterals renders hostile boxes and paths (the workspace,
// under a state directory named anyhow, and the key; a branch reaches the
// file only as its slug, which Render checks) and
// proves with real Ruby that each comes back exactly from its literal
// (nothing broke out, nothing was lost).
// hostileNames are names and paths that would break out of a Ruby literal
// written naively: the fuzz test's seeds, and TestVagrantValidate's names.
var hostileNames = []string{`"; system("id") #`, `#{exit 1}`, `\`, `\"`, "a\nb", "nul\x00byte", "\x04\x1a", "\xff\xfe invalid", "é ü 日本", `#@x #$y`, "'", "end\nend\n", "%q{", "\r\n"}

func FuzzVagrantfileLiterals(f *testing.F) {
	ruby := testutil.Program(f, "ruby")
	for _, s := range hostileNames {
		f.Add(s, "/tmp/"+s, s)
	}
	f.Fuzz(func(t *testing.T, key, path, box string) {
		if key == "" || box == "" || path == "" || strings.ContainsAny(path, `'"<>&`) {
			return // not a case: a key, box and path are never empty, and paths stay plain
		}
		v := sample("/s", DomainKVM)
		v.SSH.KeyFile, v.Box, v.Seed = key, box, path+"/seed.iso"
		b, err := Render(v)
		if err != nil {
			t.Fatal(err)
		}
		got := literals(t, ruby, b)
		for _, want := range []string{key, box, path + "/seed.iso"} {
			found := false
			for _, g := range got {
				found = found || g == want
			}
			if !found {
				t.Errorf("%q does not come back from the Vagrantfile's literals %q", want, got)
			}
		}
	})
}

func TestRubyString(t *testing.T) {
	for in, want := range map[string]string{
		`a"b`: `"a\"b"`, `#{x}`: `"\#{x}"`, `\`: `"\\"`, "\n\x00\xff": `"\x0A\x00\xFF"`, "é": `"\xC3\xA9"`,
	} {
		if got := RubyString(in); got != want {
			t.Errorf("RubyString(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestVagrantValidate runs the real `vagrant validate` (with
// vagrant-libvirt) on every golden case, its paths made real, and on
// hostile names. It needs a libvirtd (the fixture's, started when none
// runs): validating the synced folder asks the 9p and virtiofs plugins
// whether they are usable, and each asks libvirt its version
// (cap/synced_folder_*.rb, usable?).
func TestVagrantValidate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs vagrant (seconds per file)")
	}
	vg := testutil.Program(t, "vagrant")
	libvirtd.ForTest(t)
	hostile := sample("", DomainQEMU)
	hostile.Box = "box\n#{raise 'no'}\"; raise 'out' #"
	cases := map[string]Vagrantfile{"hostile": hostile}
	for _, g := range goldens {
		cases[g.name] = sample("", g.drv)
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			s := sample(root, v.Driver)
			if name == "hostile" {
				s = v
				s.SSH.KeyFile, s.Seed, s.Console, s.Share = root+"/feat-x/ssh/id_ed25519", root+"/seed.iso", root+"/console.log", root+"/feat-x/run/virtiofsd.sock"
				s.FwCfg = nil
			}
			validate(t, vg, root, s)
		})
	}
	// The fuzz test's seeds as the box's name and, where a file name can
	// hold them, in the path of the VM's key. Box names vagrant cannot look
	// up (it makes a path of them: NUL or invalid UTF-8 raise in Ruby's
	// Pathname, seen) are refused at create (CheckBoxName), so here they
	// stand in the key's path only, the box named without them.
	for i, name := range hostileNames {
		t.Run(fmt.Sprintf("name-%d", i), func(t *testing.T) {
			root := t.TempDir()
			s := sample(root, DomainQEMU)
			s.Box = name
			if CheckBoxName(name) != nil {
				s.Box = strings.TrimSpace("box " + strings.ToValidUTF8(strings.Map(func(r rune) rune {
					if unicode.IsControl(r) {
						return -1
					}
					return r
				}, name), "?"))
			}
			if !strings.ContainsAny(name, "/\x00'\"<>&") {
				s.SSH.KeyFile = filepath.Join(root, "feat-"+name, "ssh", "id_ed25519")
			}
			validate(t, vg, root, s)
		})
	}
}

// validate renders v, makes the files it names under root, and runs the
// real `vagrant validate` on it in a project of its own.
func validate(t *testing.T, vg, root string, v Vagrantfile) {
	t.Helper()
	b, err := Render(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"feat-x/workspace", "feat-x/we\"ird #{raise 'x'}\n\\dir", filepath.Dir(v.SSH.KeyFile), "project"} {
		if err := os.MkdirAll(filepath.Join(root, strings.TrimPrefix(d, root)), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WriteFile(t, v.SSH.KeyFile, "key")
	testutil.WriteFile(t, filepath.Join(root, "project/Vagrantfile"), string(b))
	cmd := exec.CommandContext(context.Background(), vg, "validate")
	cmd.Dir = filepath.Join(root, "project")
	cmd.Env = append(os.Environ(), "VAGRANT_HOME="+filepath.Join(root, "home"), "VAGRANT_CHECKPOINT_DISABLE=1",
		"VAGRANT_CWD="+cmd.Dir, "VAGRANT_DOTFILE_PATH="+filepath.Join(root, "dot"), "VAGRANT_VAGRANTFILE=Vagrantfile", "VAGRANT_DEFAULT_PROVIDER=libvirt")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("Vagrantfile validated successfully")) {
		t.Fatalf("vagrant validate: %v\n%s\n--- Vagrantfile:\n%s", err, out, b)
	}
}
