package libvirt

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
)

// kvmDomain is a VM as the driver would define it on a host with KVM:
// the workspace shared, two credentials. The paths are placeholders.
func kvmDomain() Domain {
	return Domain{
		Name: "agent-vm-feat-x-0123abcd", UUID: "0123abcd-4567-489a-8bcd-ef0123456789", Type: "kvm",
		CPUs: 4, MemoryMiB: 4096, Machine: "q35",
		Kernel:  "/var/lib/agent-vm/pool/debian-12-v7.vmlinuz",
		Initrd:  "/var/lib/agent-vm/pool/debian-12-v7.initrd",
		Cmdline: "root=/dev/vda rw console=ttyS0,115200",
		Disks: []Disk{
			{Path: "/var/lib/agent-vm/pool/feat-x-0123abcd.qcow2", Format: "qcow2"},
			{Path: "/var/lib/agent-vm/pool/feat-x-0123abcd-seed.iso", Format: "raw", ReadOnly: true},
		},
		Network: "agent-vm-feat-x-0123abcd", MAC: "52:54:00:ab:cd:ef",
		Share: &Share{Socket: "/var/lib/agent-vm/libvirt/feat-x-0123abcd/virtiofsd.sock", Tag: "workspace"},
		FwCfg: []FwCfg{
			{Name: "opt/io.systemd.credentials/agent-vm.mcp-token", File: "/var/lib/agent-vm/libvirt/feat-x-0123abcd/fw_cfg/mcp-token"},
			{Name: "opt/io.systemd.credentials/agent-vm.ssh-host-key", File: "/var/lib/agent-vm/libvirt/feat-x-0123abcd/fw_cfg/ssh-host-key"},
		},
		Console: "/var/lib/agent-vm/libvirt/feat-x-0123abcd/console.log",
	}
}

// tcgDomain is a VM on a host without usable KVM, without a share.
func tcgDomain() Domain {
	d := kvmDomain()
	d.Type = "qemu"
	d.CPUs, d.MemoryMiB = 2, 2048
	d.Share = nil
	d.FwCfg = d.FwCfg[:1]
	return d
}

var goldens = []struct {
	file   string
	domain func() Domain
}{
	{"testdata/domain-kvm.xml", kvmDomain},
	{"testdata/domain-tcg.xml", tcgDomain},
}

func TestXMLGoldens(t *testing.T) {
	for _, g := range goldens {
		x, err := g.domain().XML()
		if err != nil {
			t.Fatal(err)
		}
		testutil.Golden(t, g.file, []byte(x))
	}
}

// Values reach libvirt as given, whatever XML makes of their characters.
func TestXMLCarriesValuesUnchanged(t *testing.T) {
	d := kvmDomain()
	d.Kernel = `/srv/a'b"c&d<e>f, g/vmlinuz`
	d.Cmdline = `root=/dev/vda quiet x="a&b<c>'d'"`
	d.Share.Tag = `ws<&>"'`
	d.FwCfg[0].File = "/srv/it's & <that>"
	x, err := d.XML()
	if err != nil {
		t.Fatal(err)
	}
	var back domainXML
	if err := xml.Unmarshal([]byte(x), &back); err != nil {
		t.Fatal(err)
	}
	back.XMLName = xml.Name{}
	if sent := d.xml(); !reflect.DeepEqual(back, sent) {
		t.Errorf("the XML read back differs:\n got  %+v\n want %+v", back, sent)
	}
}

func TestXMLRefuses(t *testing.T) {
	long := strings.Repeat("x", maxTagLen+1)
	for _, c := range []struct {
		field  string
		change func(*Domain)
	}{
		{"Name", func(d *Domain) { d.Name = "" }},
		{"Name", func(d *Domain) { d.Name = "feat x" }},
		{"Name", func(d *Domain) { d.Name = "feat/x" }},
		{"Name", func(d *Domain) { d.Name = "-feat" }},
		{"Name", func(d *Domain) { d.Name = "feat'x" }},
		{"UUID", func(d *Domain) { d.UUID = "" }},
		{"UUID", func(d *Domain) { d.UUID = "0123abcd" }},
		{"Type", func(d *Domain) { d.Type = "" }},
		{"Type", func(d *Domain) { d.Type = "xen" }},
		{"CPUs", func(d *Domain) { d.CPUs = 0 }},
		{"MemoryMiB", func(d *Domain) { d.MemoryMiB = 127 }},
		{"Machine", func(d *Domain) { d.Machine = "" }},
		{"Machine", func(d *Domain) { d.Machine = "q35'" }},
		{"Kernel", func(d *Domain) { d.Kernel = "" }},
		{"Kernel", func(d *Domain) { d.Kernel = "vmlinuz" }},
		{"Kernel", func(d *Domain) { d.Kernel = "/boot/vmlinuz\n" }},
		{"Kernel", func(d *Domain) { d.Kernel = "/boot/vm\x00linuz" }},
		{"Kernel", func(d *Domain) { d.Kernel = "/boot/vm\xfflinuz" }},
		{"Initrd", func(d *Domain) { d.Initrd = "./initrd" }},
		{"Cmdline", func(d *Domain) { d.Cmdline = "console=ttyS0\nroot=/dev/vdb" }},
		{"Disks", func(d *Domain) { d.Disks = nil }},
		{"Disks", func(d *Domain) { d.Disks = make([]Disk, maxDisks+1) }},
		{"Disks[0].Path", func(d *Domain) { d.Disks[0].Path = "" }},
		{"Disks[1].Path", func(d *Domain) { d.Disks[1].Path = "seed.iso" }},
		{"Disks[1].Path", func(d *Domain) { d.Disks[1].Path = "/pool/seed\x00.iso" }},
		{"Disks[0].Format", func(d *Domain) { d.Disks[0].Format = "vmdk" }},
		{"Disks[0].Format", func(d *Domain) { d.Disks[0].Format = "" }},
		{"Network", func(d *Domain) { d.Network = "" }},
		{"Network", func(d *Domain) { d.Network = "net'work" }},
		{"MAC", func(d *Domain) { d.MAC = "" }},
		{"MAC", func(d *Domain) { d.MAC = "02:00:00:ab:cd:ef" }},
		{"MAC", func(d *Domain) { d.MAC = "52:54:00:AB:CD:EF" }},
		{"MAC", func(d *Domain) { d.MAC = "52:54:00:ab:cd" }},
		{"Share.Socket", func(d *Domain) { d.Share.Socket = "" }},
		{"Share.Socket", func(d *Domain) { d.Share.Socket = "virtiofsd.sock" }},
		{"Share.Socket", func(d *Domain) { d.Share.Socket = "/run/a\nb.sock" }},
		{"Share.Tag", func(d *Domain) { d.Share.Tag = "" }},
		{"Share.Tag", func(d *Domain) { d.Share.Tag = long }},
		{"Share.Tag", func(d *Domain) { d.Share.Tag = "work\x00space" }},
		{"FwCfg[1].Name", func(d *Domain) { d.FwCfg[1].Name = "io.systemd.credentials/agent-vm.x" }},
		{"FwCfg[1].Name", func(d *Domain) { d.FwCfg[1].Name = "opt/" }},
		{"FwCfg[1].Name", func(d *Domain) { d.FwCfg[1].Name = "opt/" + strings.Repeat("x", maxFwCfgNameLen) }},
		{"FwCfg[1].Name", func(d *Domain) { d.FwCfg[1].Name = d.FwCfg[0].Name }},
		{"FwCfg[1].Name", func(d *Domain) { d.FwCfg[1].Name = "opt/a\nb" }},
		{"FwCfg[0].File", func(d *Domain) { d.FwCfg[0].File = "" }},
		{"FwCfg[0].File", func(d *Domain) { d.FwCfg[0].File = "mcp-token" }},
		{"FwCfg[0].File", func(d *Domain) { d.FwCfg[0].File = "/run/mcp\x00token" }},
		{"Console", func(d *Domain) { d.Console = "" }},
		{"Console", func(d *Domain) { d.Console = "console.log" }},
		{"Console", func(d *Domain) { d.Console = "/var/log/console\n.log" }},
	} {
		d := kvmDomain()
		c.change(&d)
		x, err := d.XML()
		if err == nil {
			t.Errorf("%s: no error for %+v; XML:\n%s", c.field, d, x)
			continue
		}
		if !strings.Contains(err.Error(), c.field+" ") || !strings.Contains(err.Error(), "(hint: ") {
			t.Errorf("%s: the error does not name the field with a hint: %v", c.field, err)
		}
	}
}

// The real thing, as root with libvirtd: libvirt defines each golden's
// domain (under a name and uuid of the test's own) with --validate
// (libvirt's RNG schema and its QEMU driver's checks), keeps what agent-vm
// needs of it, and would start QEMU with the QEMU driver's pieces. Nothing
// is started: neither define nor domxml-to-native opens the files the XML
// names (they do not exist here) nor needs the network. A kvm domain on a
// host whose libvirt offers none (no /dev/kvm: its QEMU driver refuses the
// type before any other check) is checked against libvirt's schema alone.
func TestLibvirtDefinesTheDomain(t *testing.T) {
	testutil.Need(t, os.Geteuid() == 0, "defining a domain on the system libvirtd needs root")
	libvirtd.ForTest(t)
	virsh := testutil.Program(t, libvirtd.Virsh)
	run := func(args ...string) (string, error) {
		out, err := exec.Command(virsh, append([]string{"-c", libvirtd.URI}, args...)...).CombinedOutput()
		return string(out), err
	}
	caps, err := run("capabilities")
	if err != nil {
		t.Fatalf("virsh capabilities: %v\n%s", err, caps)
	}
	for _, g := range goldens {
		t.Run(filepath.Base(g.file), func(t *testing.T) {
			d := g.domain()
			if d.Type == "kvm" && !strings.Contains(caps, "<domain type='kvm'") {
				validateSchema(t, d)
				return
			}
			b := make([]byte, 4)
			rand.Read(b)
			d.Name, d.UUID = "agent-vm-test-"+hex.EncodeToString(b), state.NewID()
			x, err := d.XML()
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "domain.xml")
			if err := os.WriteFile(file, []byte(x), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if out, err := run("undefine", d.Name); err != nil && !strings.Contains(out, "failed to get domain") {
					t.Errorf("virsh undefine %s: %v\n%s", d.Name, err, out)
				}
			})
			if out, err := run("define", "--validate", file); err != nil {
				t.Fatalf("virsh define --validate: %v\n%s\n%s", err, out, x)
			}
			dump, err := run("dumpxml", d.Name)
			if err != nil {
				t.Fatalf("virsh dumpxml: %v\n%s", err, dump)
			}
			wantXML := []string{
				"<kernel>" + d.Kernel + "</kernel>",
				"<source network='" + d.Network + "'/>",
				"<mac address='" + d.MAC + "'/>",
				"<memballoon model='virtio' freePageReporting='on'>",
				"<controller type='usb' index='0' model='none'/>",
			}
			for _, f := range d.FwCfg {
				wantXML = append(wantXML, "<entry name='"+f.Name+"' file='"+f.File+"'/>")
			}
			if d.Share != nil {
				wantXML = append(wantXML, "<source socket='"+d.Share.Socket+"'/>", "<access mode='shared'/>")
			}
			for _, w := range wantXML {
				if !strings.Contains(dump, w) {
					t.Errorf("libvirt's XML lacks %s:\n%s", w, dump)
				}
			}
			if !strings.Contains(dump, "<genid>") {
				t.Errorf("libvirt chose no genid:\n%s", dump)
			}

			argv, err := run("domxml-to-native", "qemu-argv", "--domain", d.Name)
			if err != nil {
				t.Fatalf("virsh domxml-to-native: %v\n%s", err, argv)
			}
			wantArgv := []string{
				"-kernel " + d.Kernel, `"driver":"vmgenid"`, `"free-page-reporting":true`,
				`"driver":"virtio-rng-pci"`, "usb=off", `"mac":"` + d.MAC + `"`,
			}
			for _, f := range d.FwCfg {
				wantArgv = append(wantArgv, "-fw_cfg name="+f.Name+",file="+f.File)
			}
			if d.Share != nil {
				wantArgv = append(wantArgv, `"qom-type":"memory-backend-memfd"`, `"share":true`,
					"-chardev socket,id=chr-vu-fs0,path="+d.Share.Socket, `"tag":"`+d.Share.Tag+`"`)
			}
			if d.Type == "kvm" {
				wantArgv = append(wantArgv, "-accel kvm", "-cpu host")
			} else {
				wantArgv = append(wantArgv, "-accel tcg,tb-size=256", "-cpu max")
			}
			for _, w := range wantArgv {
				if !strings.Contains(argv, w) {
					t.Errorf("libvirt's QEMU command line lacks %s:\n%s", w, argv)
				}
			}

			if out, err := run("undefine", d.Name); err != nil {
				t.Fatalf("virsh undefine: %v\n%s", err, out)
			}
		})
	}
}

// validateSchema checks d's XML against libvirt's domain schema
// (virt-xml-validate, with xmllint), for a domain libvirt cannot define
// here; a broken copy of it must fail, so the check is seen to check.
func validateSchema(t *testing.T, d Domain) {
	t.Helper()
	validate := testutil.Program(t, "virt-xml-validate")
	testutil.Program(t, "xmllint")
	x, err := d.XML()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, c := range []struct {
		xml  string
		good bool
	}{{x, true}, {strings.Replace(x, "<devices>", "<devices><nosuchdevice/>", 1), false}} {
		file := filepath.Join(dir, "domain.xml")
		if err := os.WriteFile(file, []byte(c.xml), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(validate, file, "domain").CombinedOutput()
		if (err == nil) != c.good {
			t.Fatalf("virt-xml-validate of the %s domain: %v\n%s\n%s", map[bool]string{true: "kvm", false: "broken kvm"}[c.good], err, out, c.xml)
		}
	}
	t.Logf("libvirt offers no kvm domains here (no /dev/kvm): the kvm domain was checked against libvirt's schema only")
}
