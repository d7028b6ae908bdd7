package image

import (
	"embed"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// guestFiles are the mmdebstrap hooks that configure the guest
// (essential.sh, customize.sh; see the scripts themselves) and the files
// customize.sh installs, which it finds beside itself.
//
//go:embed guest
var guestFiles embed.FS

// debianArch is what the recipe needs to know about the host architecture
// (images are built for the architecture they will run on).
type debianArch struct {
	deb     string // Debian's name for it
	kernel  string // the kernel metapackage
	console string // the serial console for the kernel command line
}

func debianArchFor(goarch string) (debianArch, error) {
	switch goarch {
	case "amd64":
		return debianArch{deb: "amd64", kernel: "linux-image-amd64", console: "ttyS0"}, nil
	case "arm64":
		return debianArch{deb: "arm64", kernel: "linux-image-arm64", console: "ttyAMA0"}, nil
	}
	return debianArch{}, fmt.Errorf("building images on %s is not supported, only on amd64 and arm64 (hint: pass --image with a disk image for this architecture)", goarch)
}

// kernelCmdline is the command line for direct kernel boot of a built image:
// the root is the first virtio disk, whole-disk ext4; the console is the
// serial port the launcher logs.
func kernelCmdline(a debianArch) string {
	return "root=/dev/vda rw console=" + a.console + ",115200"
}

// guestPackages is what the image has on top of Debian's essential set and
// apt (recommends are not installed).
func guestPackages(a debianArch) []string {
	return []string{
		// boot and init: the kernel, a small initrd (zstd-compressed), systemd
		a.kernel, "initramfs-tools", "zstd", "kmod", "systemd-sysv", "udev", "dbus", "e2fsprogs",
		// network: networkd (part of systemd) and resolved
		"systemd-resolved", "iproute2", "netbase",
		// access and provisioning
		"openssh-server", "openssh-sftp-server", "cloud-init", "sudo",
		// what the agent works with: agent sessions run in tmux (see
		// internal/session), the agent CLIs come from npm, and the tools
		// agents reach for first
		"git", "curl", "ca-certificates", "python3", "nodejs", "npm", "procps", "tmux",
		"build-essential", "ripgrep", "jq", "fd-find", "gh", "less", "unzip",
	}
}

// requiredModules must exist (as modules or built in) in the image's kernel:
// the root disk, the network, the workspace share (virtiofs, 9p), the seed
// disk's filesystem and fw_cfg for credentials.
func requiredModules() []string {
	return []string{"virtio_pci", "virtio_blk", "ext4", "virtio_net", "virtiofs", "9p", "9pnet_virtio", "isofs", "qemu_fw_cfg"}
}

// initrdModules must be in the initrd (or built in): they mount the root.
func initrdModules() []string {
	return []string{"virtio_pci", "virtio_blk", "ext4"}
}

// aptSources are the sources.list lines for the build; the image keeps them,
// so apt in the guest gets security updates too.
func aptSources(o BuildOptions) []string {
	lines := []string{fmt.Sprintf("deb %s %s main", o.Mirror, o.Release)}
	if o.Release == "sid" || o.Release == "unstable" {
		return lines
	}
	return append(lines,
		fmt.Sprintf("deb %s %s-updates main", o.Mirror, o.Release),
		fmt.Sprintf("deb %s %s-security main", o.SecurityMirror, o.Release))
}

// mmdebstrapArgs is mmdebstrap's command line (after the program name).
func mmdebstrapArgs(o BuildOptions, a debianArch, hooksDir, rootfs string) []string {
	hook := func(script string) string {
		return "sh " + execx.ShellQuote(filepath.Join(hooksDir, script)) + ` "$1"`
	}
	args := []string{
		"--mode=root", "--variant=apt", "--format=directory",
		// The package lists and apt's cache stay (customize.sh removes
		// the downloaded packages): first boots install without an update.
		"--skip=cleanup/apt",
		"--architectures=" + a.deb,
		"--include=" + strings.Join(guestPackages(a), ","),
		`--aptopt=APT::Install-Recommends "false"`,
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
		"--essential-hook=" + hook("essential.sh"),
		"--customize-hook=" + hook("customize.sh"),
		o.Release, rootfs,
	}
	return append(args, aptSources(o)...)
}
