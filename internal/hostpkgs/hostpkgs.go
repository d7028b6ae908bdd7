// Package hostpkgs is the one list of the host programs agent-vm and its
// tests run, with the packages that provide them, and the installer that
// installs what is missing with the host's package manager. `agent-vm
// setup`, `start` (when something is missing), the README and CI all read
// this list; tests name every program they run through it (testutil.Program).
package hostpkgs

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
)

// Need says what a program is needed for. A program may serve several.
type Need uint8

const (
	// Run: running VMs (the qemu backend and the launcher).
	Run Need = 1 << iota
	// Image: building the Debian base image.
	Image
	// Test: the test suite (README's test command, CI).
	Test
	// Vagrant: the vagrant backend (vagrant, vagrant-libvirt, libvirt).
	Vagrant
	// Browser: opening in the host's browser the URLs a guest asks for
	// (internal/bridge). Nothing installs it: a host without it prints
	// the URLs instead.
	Browser
	// Libvirt: the libvirt backend (libvirt, its network's dnsmasq, nft).
	Libvirt
)

// String names the needs, for messages.
func (n Need) String() string {
	var parts []string
	for _, x := range []struct {
		n    Need
		name string
	}{{Run, "running VMs"}, {Image, "building the base image"}, {Test, "the tests"}, {Vagrant, "the vagrant backend"}, {Browser, "opening the guests' URLs"}, {Libvirt, "the libvirt backend"}} {
		if n&x.n != 0 {
			parts = append(parts, x.name)
		}
	}
	return strings.Join(parts, ", ")
}

// Program is one external program and where it comes from.
type Program struct {
	// Name is what is looked up on PATH.
	Name string
	// Paths are absolute places to look when Name is not on PATH (programs
	// that live outside PATH, like Debian 12's /usr/lib/qemu/virtiofsd).
	Paths []string
	// Debian lists the Debian/Ubuntu packages that provide it, the preferred
	// first; the installer takes the first one the package index knows.
	// Empty: no Debian package (Go comes from go.dev, see Note).
	Debian []string
	// Fedora lists the Fedora packages (dnf), the same way.
	Fedora []string
	Need   Need
	// Optional: without it agent-vm works, only worse (virtiofsd: the
	// workspace is shared over 9p). start does not stop for it.
	Optional bool
	// Note says, for a program no package provides, how to get it.
	Note string
}

// programs is the list. Keep it sorted by name.
func programs(arch string) []Program {
	qemu := qemuOf(arch)
	return []Program{
		{Name: "bash", Debian: []string{"bash"}, Fedora: []string{"bash"}, Need: Test},
		{Name: "blkid", Paths: []string{"/sbin/blkid", "/usr/sbin/blkid"}, Debian: []string{"util-linux"}, Fedora: []string{"util-linux-core"}, Need: Test},
		// The host browser agent-vm launches for a guest's DevTools relay
		// (agent-vm browser --launch); its tests launch it. Optional: a
		// user's own Chrome, or Claude in Chrome, serves as well. Fedora's
		// is chromium-browser.
		{Name: "chromium", Paths: []string{"/usr/bin/chromium-browser"}, Debian: []string{"chromium"}, Fedora: []string{"chromium"}, Need: Test, Optional: true},
		{Name: "chroot", Debian: []string{"coreutils"}, Fedora: []string{"coreutils"}, Need: Image | Test},
		{Name: "curl", Debian: []string{"curl"}, Fedora: []string{"curl"}, Need: Test},
		// GNU date reads the clock step a restored guest's own date is given.
		{Name: "date", Debian: []string{"coreutils"}, Fedora: []string{"coreutils"}, Need: Test},
		{Name: "debugfs", Paths: []string{"/sbin/debugfs", "/usr/sbin/debugfs"}, Debian: []string{"e2fsprogs"}, Fedora: []string{"e2fsprogs"}, Need: Test},
		// vagrant-libvirt's management network needs dnsmasq for DHCP;
		// Debian's libvirt only recommends it.
		{Name: "dnsmasq", Paths: []string{"/usr/sbin/dnsmasq"}, Debian: []string{"dnsmasq-base"}, Fedora: []string{"dnsmasq"}, Need: Vagrant | Libvirt | Test},
		{Name: "file", Debian: []string{"file"}, Fedora: []string{"file"}, Need: Test},
		{Name: "fish", Debian: []string{"fish"}, Fedora: []string{"fish"}, Need: Test},
		{Name: "git", Debian: []string{"git"}, Fedora: []string{"git"}, Need: Run | Test},
		// The tests serve repositories over smart HTTP with it (net/http/cgi).
		{Name: "git-http-backend", Paths: []string{"/usr/lib/git-core/git-http-backend", "/usr/libexec/git-core/git-http-backend"},
			Debian: []string{"git"}, Fedora: []string{"git"}, Need: Test},
		{Name: "go", Paths: []string{"/usr/local/go/bin/go"}, Need: Test,
			Note: "Go " + goVersion + " or newer from https://go.dev/dl (distribution packages are older)"},
		{Name: "groupadd", Paths: []string{"/usr/sbin/groupadd"}, Debian: []string{"passwd"}, Fedora: []string{"shadow-utils"}, Need: Test},
		// The tests serve an "outside" host from a network namespace of its
		// own (testutil.NewUpstream).
		{Name: "ip", Paths: []string{"/sbin/ip", "/usr/sbin/ip", "/bin/ip"}, Debian: []string{"iproute2"}, Fedora: []string{"iproute"}, Need: Test},
		{Name: "isoinfo", Debian: []string{"genisoimage"}, Fedora: []string{"genisoimage"}, Need: Test},
		// libvirtd runs the vagrant backend's machines (qemu:///system).
		{Name: "libvirtd", Paths: []string{"/usr/sbin/libvirtd"}, Debian: []string{"libvirt-daemon-system"}, Fedora: []string{"libvirt-daemon-kvm"}, Need: Vagrant | Libvirt | Test},
		{Name: "mkfs.ext4", Paths: []string{"/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4"}, Debian: []string{"e2fsprogs"}, Fedora: []string{"e2fsprogs"}, Need: Image | Test},
		{Name: "mmdebstrap", Debian: []string{"mmdebstrap"}, Fedora: []string{"mmdebstrap"}, Need: Image | Test},
		// The vagrant backend fences each VM's libvirt network with an
		// nftables table of its own (internal/libvirtnet).
		{Name: "nft", Paths: []string{"/usr/sbin/nft", "/sbin/nft"}, Debian: []string{"nftables"}, Fedora: []string{"nftables"}, Need: Vagrant | Libvirt | Test},
		{Name: "nix", Debian: []string{"nix-bin"}, Need: Test},
		{Name: "nix-instantiate", Debian: []string{"nix-bin"}, Need: Test},
		{Name: "node", Debian: []string{"nodejs"}, Fedora: []string{"nodejs"}, Need: Test},
		{Name: "npm", Debian: []string{"npm"}, Fedora: []string{"npm"}, Need: Test},
		// Tests hold agent-vm's naming of CA certificates (the guest's hash
		// links) to OpenSSL's own, over the host's bundle (ca-certificates).
		{Name: "openssl", Debian: []string{"openssl", "ca-certificates"}, Fedora: []string{"openssl"}, Need: Test},
		{Name: "pgrep", Debian: []string{"procps"}, Fedora: []string{"procps-ng"}, Need: Test},
		qemu,
		{Name: "ps", Debian: []string{"procps"}, Fedora: []string{"procps-ng"}, Need: Test},
		// Tests run guest Python on the host: the template's agent probe
		// (it reads package.json with the guest's python3, cloud-init's)
		// and the base image's cloud-init stage server.
		{Name: "python3", Debian: []string{"python3"}, Fedora: []string{"python3"}, Need: Test},
		{Name: "qemu-img", Debian: []string{"qemu-utils"}, Fedora: []string{"qemu-img"}, Need: Run | Image | Test},
		// Tests write and read patterns in disk images with it (a disk copy's
		// content and divergence).
		{Name: "qemu-io", Debian: []string{"qemu-utils"}, Fedora: []string{"qemu-img"}, Need: Test},
		{Name: "ruby", Debian: []string{"ruby"}, Fedora: []string{"ruby"}, Need: Test},
		{Name: "script", Debian: []string{"bsdutils"}, Fedora: []string{"util-linux-script"}, Need: Test},
		{Name: "sh", Debian: []string{"dash"}, Fedora: []string{"bash"}, Need: Test},
		{Name: "shellcheck", Debian: []string{"shellcheck"}, Fedora: []string{"ShellCheck"}, Need: Test},
		{Name: "sleep", Debian: []string{"coreutils"}, Fedora: []string{"coreutils"}, Need: Test},
		// `host doctor` looks for virtiofsd on a qemu+ssh host with it.
		{Name: "ssh", Debian: []string{"openssh-client"}, Fedora: []string{"openssh-clients"}, Need: Test},
		{Name: "ssh-keygen", Debian: []string{"openssh-client"}, Fedora: []string{"openssh-clients"}, Need: Test},
		{Name: "sshd", Paths: []string{"/usr/sbin/sshd"}, Debian: []string{"openssh-server"}, Fedora: []string{"openssh-server"}, Need: Test},
		{Name: "systemd-analyze", Debian: []string{"systemd"}, Fedora: []string{"systemd"}, Need: Test},
		{Name: "tmux", Debian: []string{"tmux"}, Fedora: []string{"tmux"}, Need: Test},
		{Name: "unshare", Debian: []string{"util-linux"}, Fedora: []string{"util-linux-core"}, Need: Image | Test},
		// agent-vm run as root makes its account with useradd and groupadd
		// (Account); every distribution's base system has them, so nothing
		// installs them for running VMs, and a host without them gets
		// CreateAccount's hint.
		{Name: "useradd", Paths: []string{"/usr/sbin/useradd"}, Debian: []string{"passwd"}, Fedora: []string{"shadow-utils"}, Need: Test},
		{Name: "userdel", Paths: []string{"/usr/sbin/userdel"}, Debian: []string{"passwd"}, Fedora: []string{"shadow-utils"}, Need: Test},
		// Debian 12 ships QEMU's C virtiofsd in qemu-system-common (pulled in
		// by qemu-system-x86); later releases package the Rust one.
		// The plugin's package brings vagrant itself; doctor checks that
		// vagrant lists the plugin.
		{Name: "vagrant", Debian: []string{"vagrant-libvirt"}, Fedora: []string{"vagrant-libvirt"}, Need: Vagrant | Test},
		// `host doctor` runs it too, against any host's URI.
		{Name: "virsh", Debian: []string{"libvirt-clients"}, Fedora: []string{"libvirt-client"}, Need: Vagrant | Libvirt | Test},
		// A domain libvirt cannot define here (kvm, on a host without
		// /dev/kvm) is checked against libvirt's schema; it runs xmllint.
		{Name: "virt-xml-validate", Debian: []string{"libvirt-clients"}, Fedora: []string{"libvirt-client"}, Need: Test},
		{Name: "virtiofsd", Paths: []string{"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"},
			Debian: []string{"virtiofsd", "qemu-system-common"}, Fedora: []string{"virtiofsd"}, Need: Run | Test, Optional: true},
		// libvirt needs it running before a domain starts (the tests' libvirtd
		// fixture starts it where no init did).
		{Name: "virtlogd", Paths: []string{"/usr/sbin/virtlogd"}, Debian: []string{"libvirt-daemon-system"}, Fedora: []string{"libvirt-daemon"}, Need: Vagrant | Libvirt | Test},
		{Name: "xdg-open", Debian: []string{"xdg-utils"}, Fedora: []string{"xdg-utils"}, Need: Browser, Optional: true},
		{Name: "xmllint", Debian: []string{"libxml2-utils"}, Fedora: []string{"libxml2"}, Need: Test},
		{Name: "xorriso", Debian: []string{"xorriso"}, Fedora: []string{"xorriso"}, Need: Test},
		{Name: "zsh", Debian: []string{"zsh"}, Fedora: []string{"zsh"}, Need: Test},
	}
}

// goVersion is the Go go.mod asks for (kept in step by a test).
const goVersion = "1.26"

// All returns every program, for this host's architecture.
func All() []Program { return programs(runtime.GOARCH) }

// QEMU is QEMU's system emulator for this machine's architecture.
func QEMU() Program { return qemuOf(runtime.GOARCH) }

func qemuOf(arch string) Program {
	if arch == "arm64" {
		return Program{Name: "qemu-system-aarch64", Debian: []string{"qemu-system-arm"}, Fedora: []string{"qemu-system-aarch64-core"}, Need: Run | Test}
	}
	return Program{Name: "qemu-system-x86_64", Debian: []string{"qemu-system-x86"}, Fedora: []string{"qemu-system-x86-core"}, Need: Run | Test}
}

// For returns the programs any of need asks for.
func For(need Need) []Program {
	var out []Program
	for _, p := range All() {
		if p.Need&need != 0 {
			out = append(out, p)
		}
	}
	return out
}

// Lookup returns the program called name, or an error saying it is not on
// the list (tests may run only listed programs).
func Lookup(name string) (Program, error) {
	for _, p := range All() {
		if p.Name == name {
			return p, nil
		}
	}
	return Program{}, fmt.Errorf("%q is not on agent-vm's list of host programs (hint: add it, with its packages, to internal/hostpkgs)", name)
}

// PackageHint is how a message names a program's package: "Debian package
// X" or the note when no package provides it.
func (p Program) PackageHint() string {
	if len(p.Debian) == 0 {
		return p.Note
	}
	return "Debian package " + strings.Join(p.Debian, " or ")
}

// DebianPackages returns the distinct first-choice Debian packages of progs,
// sorted, for messages and documentation.
func DebianPackages(progs []Program) []string {
	var out []string
	for _, p := range progs {
		if len(p.Debian) > 0 && !slices.Contains(out, p.Debian[0]) {
			out = append(out, p.Debian[0])
		}
	}
	slices.Sort(out)
	return out
}

// InstallHint says how to get a program: setup, and its package from the
// list (the one place that names packages).
func InstallHint(name string) string {
	p, err := Lookup(name)
	if err != nil {
		return "install " + name
	}
	return "`sudo agent-vm setup` installs it (" + p.PackageHint() + ")"
}
