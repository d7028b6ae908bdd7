#!/bin/sh
# mmdebstrap --essential-hook for agent-vm's base image; $1 is the root
# filesystem. It runs after the Essential:yes packages and before the rest, so
# the kernel package's own update-initramfs already builds the small initrd.
set -eu
root=$1

# A small initrd for direct kernel boot under QEMU: only what mounts the root
# disk (virtio-blk, ext4 and their dependencies). Everything else (virtio-net,
# virtiofs, 9p, isofs for the seed) loads later from the root filesystem.
mkdir -p "$root/etc/initramfs-tools/conf.d" "$root/etc/initramfs-tools/hooks"
cat > "$root/etc/initramfs-tools/conf.d/agent-vm.conf" <<'CONF'
# agent-vm: list only the modules the hook below adds; the root is ext4.
MODULES=list
FSTYPE=ext4
CONF
cat > "$root/etc/initramfs-tools/hooks/agent-vm" <<'HOOK'
#!/bin/sh
# agent-vm: the modules that mount the root disk (dependencies follow).
PREREQ=""
prereqs() { echo "$PREREQ"; }
case "${1:-}" in
prereqs) prereqs; exit 0 ;;
esac
. /usr/share/initramfs-tools/hook-functions
manual_add_modules virtio_pci virtio_blk ext4
HOOK
chmod 0755 "$root/etc/initramfs-tools/hooks/agent-vm"
