// Package libvirt is the libvirt driver: it runs the qemu backend's
// Debian guest (the libvirt backend, internal/libvirtbackend) through
// libvirt's API (go-libvirt) on this machine's system libvirtd, as root.
// A start (Driver.Start) makes, in this order: the workspace's virtiofsd,
// agent-vm's own and jailed as the workspace's owner (internal/virtiofsd),
// its socket handed to libvirt's QEMU alone, which libvirt only connects
// to; the credential copies QEMU reads through fw_cfg, readable by that
// user alone (internal/qemuuser), in the machine's handoff directory; the
// contained network (internal/libvirtnet: a libvirt network of the VM's
// own, the egress proxy on its bridge, the nftables fence); the host's
// verbs (Host, host.go): the base image's volumes uploaded once per
// version into agent-vm's storage pool (internal/virtpool), the root
// overlay once per VM, the seed at every start, the domain defined afresh
// from its XML (Domain, rendered from typed structs through encoding/xml
// by pure functions, as internal/qemu's argv.go builds QEMU's command
// line) and started; then the forwards, one `agent-vm net-forward` per
// host port on 127.0.0.1 to the guest's address (forward.go). A failed
// start forces the domain off and ends what it made; the root volume
// stays. Stop shuts the guest down and ends the rest; Destroy removes the
// domain, its volumes, its network and its handoff directory. Suspend
// pauses the domain in place (libvirt saves no domain with a virtiofs
// share). Inspect reads libvirt's state and reason: a QEMU that ended
// without a clean shutdown is crashed.
//
// Host is the same whether it is this machine or another reached over
// agent-vm's link (internal/hostlink); the driver runs on this machine's
// libvirtd only so far (docs/scaling.md).
//
// Under qemu:///system libvirt runs QEMU as another user (Debian:
// libvirt-qemu) and hands it only the files the domain XML names (disks,
// kernel, initrd, fw_cfg files, the virtiofsd socket), chowning the files
// but never their directories: every directory above them must be
// searchable by that user (internal/vagrant's package doc, "Files QEMU
// opens"). libvirt checks none of them when the domain is defined, only
// when it starts.
package libvirt

import (
	"encoding/xml"
	"fmt"

	"github.com/agent-vm/agent-vm/internal/accel"
)

// Domain is everything a VM's libvirt domain says; XML renders it through
// encoding/xml (typed structs, never string templates) and depends only on
// it. The guest is x86_64: arm64 would need an architecture of its own
// (machine virt, console ttyAMA0, no vmgenid in QEMU 7.2).
type Domain struct {
	Name string // libvirt domain name, [A-Za-z0-9_.-], starting with a letter or digit
	UUID string // the VM's uuid
	Type string // "kvm", or "qemu" (TCG: no usable KVM)

	CPUs      int
	MemoryMiB int
	Machine   string // "q35" on x86_64

	// Direct kernel boot: the guest has no bootloader. Initrd and Cmdline
	// may be empty.
	Kernel, Initrd, Cmdline string

	Disks   []Disk  // in order: vda (the root overlay), vdb (the cloud-init seed, read-only)
	Network string  // the libvirt network the one NIC is on
	MAC     string  // that NIC's MAC (the seed's network-config matches it)
	Share   *Share  // the workspace, or nil
	FwCfg   []FwCfg // files handed to the guest through QEMU's fw_cfg (systemd credentials)
	Console string  // the file the serial console is written to
}

// Disk is a virtio block device backed by a file on the libvirt host.
type Disk struct {
	Path     string
	Format   string // "qcow2" or "raw"
	ReadOnly bool
}

// Share is the workspace as a virtiofs device served by an externally
// started virtiofsd (internal/virtiofsd, jailed), which libvirt only
// connects to: Socket is that virtiofsd's socket, Tag what the guest
// mounts.
type Share struct {
	Socket, Tag string
}

// FwCfg is a file handed to the guest through QEMU's fw_cfg under Name,
// e.g. opt/io.systemd.credentials/agent-vm.mcp-token: QEMU reads File when
// it starts. Only ever a file, never an inline value: any read-only
// libvirt client can read a domain's XML.
type FwCfg struct {
	Name, File string
}

// XML is d's domain XML for virDomainDefineXML, or an error naming the
// field that is wrong.
func (d Domain) XML() (string, error) {
	if err := d.validate(); err != nil {
		return "", err
	}
	out, err := xml.MarshalIndent(d.xml(), "", "  ")
	if err != nil {
		return "", fmt.Errorf("rendering domain %q's XML: %w", d.Name, err)
	}
	return string(out) + "\n", nil
}

// cmdline is the kernel's command line: under TCG (type "qemu")
// accel.KernelCmdline's, as the qemu driver boots its guests.
func (d Domain) cmdline() string {
	if d.Kernel == "" || d.Type != "qemu" {
		return d.Cmdline
	}
	return accel.KernelCmdline(accel.TCG, d.Cmdline)
}

// xml is d as libvirt's domain XML says it (https://libvirt.org/formatdomain.html).
//
// What the QEMU driver's command line has and this does not say, libvirt
// adds itself (`virsh domxml-to-native qemu-argv`, libvirt 9.0 with QEMU
// 7.2): -nodefaults and -display none; -sandbox with the QEMU driver's
// policy (qemu.conf's seccomp_sandbox); its own QMP socket; with a share,
// the guest's RAM as the machine's memfd backend, shared (the QEMU
// driver's sharedMemoryArgs); each PCI device on a PCIe root port of its
// own, so the virtiofs device can be unplugged as on the QEMU driver's
// shareSlotArgs port; QEMU run as libvirt's user instead of -runas. The
// machine "q35" becomes its versioned name (pc-q35-7.2) when the domain is
// defined. libvirt also adds a PS/2 keyboard and mouse (q35 has them
// whatever the command line) and an audio backend "none".
//
// The VM generation ID (vmgenid, the QEMU driver's machineArgs: it tells a
// guest restored from a saved state to reseed its RNG; QEMU 7.2 has it on
// x86 only) is an empty <genid/>: libvirt chooses one when the domain is
// defined and a new one whenever it is restored or reverted to a snapshot.
func (d Domain) xml() domainXML {
	x := domainXML{
		Type:          d.Type,
		Name:          d.Name,
		UUID:          d.UUID,
		GenID:         &struct{}{},
		Memory:        sizeXML{Unit: "MiB", Value: d.MemoryMiB},
		CurrentMemory: sizeXML{Unit: "MiB", Value: d.MemoryMiB},
		VCPU:          d.CPUs,
		OS: osXML{
			Type:    osTypeXML{Arch: "x86_64", Machine: d.Machine, Value: "hvm"},
			Kernel:  d.Kernel,
			Initrd:  d.Initrd,
			Cmdline: d.cmdline(),
		},
		Features:   featuresFor(d.Type),
		CPU:        cpuFor(d.Type),
		Clock:      clockXML{Offset: "utc"},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
	}
	if d.Share != nil {
		x.MemoryBacking = &memoryBackingXML{Source: typeXML{Type: "memfd"}, Access: accessXML{Mode: "shared"}}
	}
	if len(d.FwCfg) > 0 {
		x.SysInfo = &sysinfoXML{Type: "fwcfg"}
		for _, f := range d.FwCfg {
			x.SysInfo.Entries = append(x.SysInfo.Entries, entryXML{Name: f.Name, File: f.File})
		}
	}
	x.Devices = d.devices()
	return x
}

// featuresFor are the machine's features: ACPI (the guest powers off
// through it), and under TCG a 256 MiB translation cache, as the QEMU
// driver's accelArgs have it (QEMU's resident memory ~0.7 GB instead of
// ~1.6 GB there); libvirt refuses TCG features on a kvm domain.
func featuresFor(typ string) featuresXML {
	f := featuresXML{ACPI: &struct{}{}}
	if typ == "qemu" {
		f.TCG = &tcgXML{TBCache: sizeXML{Unit: "MiB", Value: 256}}
	}
	return f
}

// cpuFor is the guest's CPU: the host's under KVM (-cpu host), QEMU's
// richest model under TCG (-cpu max; mode maximum, libvirt >= 7.1).
// check='none': libvirt compares no CPU model with the host's, there is
// none to compare.
func cpuFor(typ string) cpuXML {
	if typ == "kvm" {
		return cpuXML{Mode: "host-passthrough"}
	}
	return cpuXML{Mode: "maximum", Check: "none"}
}

// devices are the machine's devices, in the order libvirt writes them.
// The serial console goes to a file through virtlogd (libvirt's default
// stdio_handler "logd"), which runs as root; without append='on' the file
// is emptied at each start, as QEMU's -serial file: does. <console> is the
// same port seen as the domain's console, as libvirt itself writes it.
//
// The virtiofs device gets 1024 descriptors per queue, as virtiofsd's own
// examples give it; the QEMU driver's virtiofsDevice leaves QEMU's default
// (128).
func (d Domain) devices() devicesXML {
	var dev devicesXML
	for i, disk := range d.Disks {
		x := diskXML{
			Type:   "file",
			Device: "disk",
			Driver: diskDriverXML{Name: "qemu", Type: disk.Format},
			Source: fileSourceXML{File: disk.Path},
			Target: diskTargetXML{Dev: diskTarget(i), Bus: "virtio"},
		}
		if disk.ReadOnly {
			x.ReadOnly = &struct{}{}
		} else {
			x.Driver.Discard = "unmap"
		}
		dev.Disks = append(dev.Disks, x)
	}
	// No USB controller: q35 would get a qemu-xhci by default.
	dev.Controllers = []controllerXML{{Type: "usb", Model: "none"}}
	if d.Share != nil {
		dev.Filesystems = []filesystemXML{{
			Type:   "mount",
			Driver: fsDriverXML{Type: "virtiofs", Queue: 1024},
			Source: socketSourceXML{Socket: d.Share.Socket},
			Target: fsTargetXML{Dir: d.Share.Tag},
		}}
	}
	dev.Interfaces = []interfaceXML{{
		Type:   "network",
		MAC:    addressXML{Address: d.MAC},
		Source: networkSourceXML{Network: d.Network},
		Model:  typeXML{Type: "virtio"},
	}}
	dev.Serials = []charXML{{Type: "file", Source: pathSourceXML{Path: d.Console}, Target: charTargetXML{Port: 0}}}
	dev.Consoles = []charXML{{Type: "file", Source: pathSourceXML{Path: d.Console}, Target: charTargetXML{Type: "serial", Port: 0}}}
	// The balloon is never inflated: it reports the guest's freed pages,
	// which QEMU gives back to the host (see the QEMU driver's machineArgs).
	dev.MemBalloon = memballoonXML{Model: "virtio", FreePageReporting: "on"}
	dev.RNG = rngXML{Model: "virtio", Backend: rngBackendXML{Model: "random", Value: "/dev/urandom"}}
	return dev
}

// diskTarget is the i-th virtio disk's name: vda, vdb, ... vdz (validate
// allows no more).
func diskTarget(i int) string {
	return "vd" + string(rune('a'+i))
}
