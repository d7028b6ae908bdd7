package qemu

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/driver"
)

// Arch describes the QEMU target for the host's architecture.
type Arch struct {
	Binary  string // qemu-system-x86_64
	Package string // the Debian package that has it
	Machine string // q35
	Console string // ttyS0
}

// HostArch is the Arch matching the CPU agent-vm runs on (guests run at
// native speed only on the same architecture).
func HostArch() (Arch, error) {
	return ArchFor(runtime.GOARCH)
}

// ArchFor maps a GOARCH to its QEMU target.
func ArchFor(goarch string) (Arch, error) {
	switch goarch {
	case "amd64":
		return Arch{Binary: "qemu-system-x86_64", Package: "qemu-system-x86", Machine: "q35", Console: "ttyS0"}, nil
	case "arm64":
		return Arch{Binary: "qemu-system-aarch64", Package: "qemu-system-arm", Machine: "virt", Console: "ttyAMA0"}, nil
	}
	return Arch{}, fmt.Errorf("agent-vm runs VMs on amd64 and arm64 hosts, not %s", goarch)
}

// esc escapes a value for QEMU's comma-separated option syntax.
func esc(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// unesc is the first value of an option string, unescaped: what esc made
// of it, from "value,key=...,...".
func unesc(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			if i+1 == len(s) || s[i+1] != ',' {
				break
			}
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// identityArgs name the VM and make its QEMU findable in /proc.
func identityArgs(m Machine) []string {
	return []string{"-name", esc(m.Name), "-uuid", m.UUID}
}

// accelArgs selects the accelerator. Under TCG, a 256 MiB translation cache
// cut QEMU's resident memory from ~1.6 GB to ~0.7 GB here at no boot cost.
func accelArgs(accel string) []string {
	if accel == "kvm" {
		return []string{"-accel", "kvm", "-cpu", "host"}
	}
	return []string{"-accel", "tcg,tb-size=256", "-cpu", "max"}
}

// scriptAccelArgs override the accelerator of a script's own command line
// (nixpkgs uses `-machine accel=kvm:tcg`, which would pick a hanging KVM).
// -machine options merge, so this later value wins.
func scriptAccelArgs(accel string) []string {
	if accel == "kvm" {
		return nil
	}
	return []string{"-machine", "accel=tcg"}
}

// machineArgs sets the machine type, size and the devices every VM has.
// vmgenid (guid=auto, a new random one in every QEMU process) tells a
// guest that it was restored from a saved state: QEMU writes the new
// generation ID after loading a state and notifies the guest, and Linux
// (>= 5.18, its vmgenid driver) reseeds its RNG on it, so two machines
// restored from one template (internal/template) do not share RNG state. QEMU
// 7.2 has it on x86 only (arm64's virt got it later).
//
// The balloon reports the guest's free memory (free-page-reporting): the
// guest's kernel hands pages it freed back to QEMU in 2 MiB blocks and
// QEMU discards them (from the shared memfd too), so memory the guest used
// once and freed (a build, a big test run) leaves QEMU's resident memory
// instead of staying there until the VM stops. Pages the guest keeps as
// page cache are not free and stay. The balloon is never inflated:
// agent-vm does not take memory from a guest.
func machineArgs(a Arch, m Machine) []string {
	out := []string{
		"-machine", a.Machine,
		"-smp", strconv.Itoa(m.CPUs),
		"-m", strconv.Itoa(m.MemoryMiB) + "M",
		"-nodefaults", "-display", "none", "-vga", "none",
		"-device", "virtio-rng-pci",
		"-device", "virtio-balloon-pci,id=agentvm-balloon,free-page-reporting=on",
	}
	if a.Machine == "q35" {
		out = append(out, "-device", "vmgenid,guid=auto")
	}
	return out
}

// sharedMemoryArgs back guest RAM with a shared memfd, which vhost-user
// devices (virtiofs) need. Its size must equal -m.
func sharedMemoryArgs(memMiB int) []string {
	return []string{
		"-object", fmt.Sprintf("memory-backend-memfd,id=agentvm-mem,size=%dM,share=on", memMiB),
		"-numa", "node,memdev=agentvm-mem",
	}
}

// shareArgs attach the workspace: virtiofs through virtiofsd's socket, or
// 9p served by QEMU itself. security_model=none keeps host ownership rules:
// files belong to the user QEMU runs as, which for a root agent-vm is the
// workspace's owner (-runas), so the guest's root cannot chown to root nor
// make device nodes; it can set the owner's setuid bit and make FIFOs,
// which only virtiofs (through the jail, package sharejail) refuses.
//
// slot, when set, is the PCIe root port the virtiofs device sits on, so
// that it can be unplugged for a suspend and plugged again on resume
// (suspend.go); "" puts it on the root bus (Script boots).
func shareArgs(mode driver.ShareMode, s driver.Share, virtiofsdSock, slot string) []string {
	if mode == driver.ShareVirtiofs {
		return []string{
			"-chardev", "socket,id=" + ShareChardev + ",path=" + esc(virtiofsdSock),
			"-device", virtiofsDevice(s, slot),
		}
	}
	return []string{"-virtfs", "local,path=" + esc(s.Source) + ",mount_tag=" + esc(s.Tag) + ",security_model=none,id=agentvm-fs"}
}

// Ids of the workspace share's parts on a Direct boot's command line.
const (
	ShareSlot    = "agentvm-share-slot" // the hot-pluggable PCIe root port
	ShareDevice  = "agentvm-share"      // the vhost-user-fs-pci device on it
	ShareChardev = "agentvm-fs"         // its socket to virtiofsd
)

// virtiofsDevice is the vhost-user-fs-pci device's option string, on slot
// when one is given.
func virtiofsDevice(s driver.Share, slot string) string {
	dev := "vhost-user-fs-pci,chardev=" + ShareChardev + ",tag=" + esc(s.Tag)
	if slot != "" {
		dev += ",id=" + ShareDevice + ",bus=" + slot
	}
	return dev
}

// shareSlotArgs add an empty PCIe root port for the virtiofs device, which
// QEMU can hot-unplug only from such a port (not from the root bus). On
// q35 and arm64's virt alike the root bus is pcie.0. It comes last among
// the PCI devices, so the slots of the others (the NIC's names in the
// guest) stay where they were before it existed.
func shareSlotArgs() []string {
	return []string{"-device", "pcie-root-port,id=" + ShareSlot + ",bus=pcie.0,chassis=1"}
}

// DirectNetdev is the id of a Direct boot's user-mode netdev, where
// forwards added while the VM runs go (AddForward).
const DirectNetdev = "agentvm-net"

// hostfwd is QEMU's rule for a forward from 127.0.0.1 only: nothing a VM
// serves is reachable from other machines.
func hostfwd(f driver.Forward) string {
	return fmt.Sprintf("tcp:127.0.0.1:%d-:%d", f.Host, f.Guest)
}

// netArgs is user-mode networking with host forwards bound to 127.0.0.1
// only, contained when the machine has a Network (netOpts).
func netArgs(m Machine, mac string) []string {
	opts := []string{"user", "id=" + DirectNetdev}
	for _, f := range m.Forwards {
		opts = append(opts, "hostfwd="+hostfwd(f))
	}
	opts = append(opts, netOpts(m)...)
	dev := "virtio-net-pci,netdev=" + DirectNetdev
	if mac != "" {
		dev += ",mac=" + mac
	}
	return []string{"-netdev", strings.Join(opts, ","), "-device", dev}
}

// diskArgs attaches the disks as virtio block devices. A writable disk's
// file is opened read-write once, before -runas: with auto-read-only (on
// by default) QEMU reopens it by its path when a migration (suspend.go)
// hands it over or takes it back, which the unprivileged user QEMU became
// cannot (its directory is private), and the migration fails
// ("bdrv_inactivate_all() failed").
func diskArgs(disks []Disk) []string {
	var out []string
	for _, d := range disks {
		opt := "file=" + esc(d.Path) + ",if=virtio,format=" + d.Format
		if d.ReadOnly {
			opt += ",readonly=on"
		} else {
			opt += ",discard=unmap,file.auto-read-only=off"
		}
		out = append(out, "-drive", opt)
	}
	return out
}

// kernelArgs boots a kernel directly, skipping firmware and bootloader;
// its command line is accel.KernelCmdline's.
func kernelArgs(d *Direct, accelerator string) []string {
	if d.Kernel == "" {
		return nil
	}
	out := []string{"-kernel", d.Kernel}
	if d.Initrd != "" {
		out = append(out, "-initrd", d.Initrd)
	}
	if app := accel.KernelCmdline(accelerator, d.Append); app != "" {
		out = append(out, "-append", app)
	}
	return out
}

// credentialArgs hand secrets to the guest as systemd credentials.
func credentialArgs(creds []driver.Credential) []string {
	var out []string
	for _, c := range creds {
		out = append(out, "-fw_cfg", "name=opt/io.systemd.credentials/"+c.Name+",file="+esc(c.File))
	}
	return out
}

// controlArgs give the launcher its handles on the VM: QMP (a unix socket
// in a private directory, chmod 0600 once it answers) and the pid file. No
// human monitor: consoleArgs turn the default one off.
func controlArgs(m Machine) []string {
	return []string{
		"-qmp", "unix:" + esc(m.QMPPath()) + ",server=on,wait=off",
		"-pidfile", m.runFile(PidFile),
	}
}

// consoleArgs write the serial console to the console log.
func consoleArgs(m Machine) []string {
	return []string{"-serial", "file:" + esc(m.ConsoleLogPath()), "-monitor", "none"}
}

// DirectArgv is the whole QEMU command line (without the binary) for a
// Direct boot. -nodefaults leaves out every device not listed (no USB
// controller, no floppy, no CD-ROM, no parallel port, no default NIC).
func DirectArgv(a Arch, m Machine, d *Direct, accel string, mode driver.ShareMode, h Hardening) []string {
	return directArgv(a, m, d, accel, mode, h, false)
}

// ResumeArgv is DirectArgv for a resume from a saved state (suspend.go):
// the same machine without the virtiofs device and its socket, which are
// plugged in once the state is loaded, waiting (-incoming defer, -S) for
// the state to be handed over QMP.
func ResumeArgv(a Arch, m Machine, d *Direct, accel string, mode driver.ShareMode, h Hardening) []string {
	return directArgv(a, m, d, accel, mode, h, true)
}

func directArgv(a Arch, m Machine, d *Direct, accel string, mode driver.ShareMode, h Hardening, resume bool) []string {
	var argv []string
	argv = append(argv, identityArgs(m)...)
	argv = append(argv, hardeningArgs(h)...)
	argv = append(argv, machineArgs(a, m)...)
	argv = append(argv, accelArgs(accel)...)
	if mode == driver.ShareVirtiofs {
		argv = append(argv, sharedMemoryArgs(m.MemoryMiB)...)
	}
	argv = append(argv, kernelArgs(d, accel)...)
	argv = append(argv, diskArgs(d.Disks)...)
	argv = append(argv, netArgs(m, d.MAC)...)
	argv = append(argv, shareSlotArgs()...)
	if !resume || mode != driver.ShareVirtiofs {
		argv = append(argv, shareArgs(mode, m.Share, m.sockFile(VirtiofsdSock), ShareSlot)...)
	}
	argv = append(argv, credentialArgs(m.Credentials)...)
	argv = append(argv, consoleArgs(m)...)
	argv = append(argv, controlArgs(m)...)
	if resume {
		argv = append(argv, "-incoming", "defer", "-S")
	}
	return argv
}

// ScriptNetOpts is the QEMU_NET_OPTS a Script boot gets: the machine's
// forwards that the script's own command line does not make (s.Forwarded)
// and the containment of its Network (netOpts), which nixpkgs' run script
// appends to its netdev's options. "" when none.
func ScriptNetOpts(m Machine, s *Script) string {
	var opts []string
	for _, f := range m.Forwards {
		if !slices.Contains(s.Forwarded, f.Host) {
			opts = append(opts, "hostfwd="+hostfwd(f))
		}
	}
	opts = append(opts, netOpts(m)...)
	return strings.Join(opts, ",")
}

// ScriptArgs is what the launcher appends to a Script's own command line.
// nixpkgs' run-<name>-vm ends in `$QEMU_OPTS "$@"`: its arguments reach QEMU
// verbatim, so the launcher passes these as arguments (QEMU_OPTS would be
// word-split). The script sets memory, CPUs, disks, the forwarded ports and
// -nographic, and the shared memory virtiofs needs: the guest module asks
// qemu-vm.nix for it (virtualisation.qemu.enableSharedMemory), so the
// launcher never adds a second memory backend.
func ScriptArgs(m Machine, accel string, mode driver.ShareMode, h Hardening) []string {
	argv := []string{"-uuid", m.UUID}
	argv = append(argv, hardeningArgs(h)...)
	argv = append(argv, scriptAccelArgs(accel)...)
	argv = append(argv, shareArgs(mode, m.Share, m.sockFile(VirtiofsdSock), "")...)
	argv = append(argv, credentialArgs(m.Credentials)...)
	argv = append(argv, consoleArgs(m)...)
	argv = append(argv, controlArgs(m)...)
	return argv
}
