#!/bin/sh
# mmdebstrap --customize-hook for agent-vm's base image; $1 is the root
# filesystem, with every package installed.
set -eu
root=$1

# The launcher attaches the root disk first, as a whole-disk ext4 (no
# partition table) on virtio-blk.
echo '/dev/vda / ext4 rw,discard,errors=remount-ro 0 1' > "$root/etc/fstab"

# Replace what mmdebstrap copied from the build host. cloud-init sets the
# real hostname from the seed's meta-data.
echo agent-vm > "$root/etc/hostname"
ln -sfn ../run/systemd/resolve/stub-resolv.conf "$root/etc/resolv.conf"
# C.UTF-8 needs no generated locale; with it set, cloud-init's locale module
# has nothing to regenerate at first boot.
echo 'LANG=C.UTF-8' > "$root/etc/default/locale"

# Network: DHCP on QEMU's user-mode network, whatever the NIC is called.
# cloud-init's own network-config, when the seed has one, takes precedence.
mkdir -p "$root/etc/systemd/network"
cat > "$root/etc/systemd/network/90-agent-vm-dhcp.network" <<'NET'
[Match]
Name=en* eth*

[Network]
DHCP=yes
NET
chroot "$root" systemctl enable systemd-networkd.service systemd-resolved.service

# cloud-init reads only the NoCloud seed (a disk labelled cidata), and runs
# only the modules agent-vm's seed (internal/cloudinit) has work for, besides
# the keys and message it prints at the end. Debian's others have nothing to
# do in these VMs (no grub, snap, partition table, swap, ephemeral disk or
# password) but cost each boot stage their import, and some a program too
# (grub-dpkg runs debconf-set-selections: about 4 s under TCG).
mkdir -p "$root/etc/cloud/cloud.cfg.d"
cat > "$root/etc/cloud/cloud.cfg.d/90-agent-vm.cfg" <<'CFG'
# agent-vm: the seed is a NoCloud disk; never probe cloud metadata services.
datasource_list: [ NoCloud, None ]
# agent-vm: the modules its seed uses, in Debian's order.
cloud_init_modules: [ seed_random, bootcmd, write-files, resizefs, set_hostname, update_hostname, update_etc_hosts, users-groups, ssh ]
cloud_config_modules: [ locale, runcmd ]
cloud_final_modules: [ write-files-deferred, scripts-vendor, scripts-per-once, scripts-per-boot, scripts-per-instance, scripts-user, ssh-authkey-fingerprints, keys-to-console, final-message ]
CFG

# cloud-init's four boot stages run in one Python process, which imports
# cloud-init once instead of four times (4-15 s each under TCG); see
# cloud-init-server. Its files are beside this script.
files=$(dirname "$0")
install -D -m 0755 "$files/cloud-init-server" "$root/usr/lib/agent-vm/cloud-init-server"
install -D -m 0755 "$files/cloud-init-stage" "$root/usr/lib/agent-vm/cloud-init-stage"
install -D -m 0644 "$files/agent-vm-cloud-init.service" "$root/etc/systemd/system/agent-vm-cloud-init.service"
stage() { # UNIT STAGE COMMAND...: the unit runs STAGE through the server
	unit=$1 stage=$2
	shift 2
	mkdir -p "$root/etc/systemd/system/$unit.d"
	cat > "$root/etc/systemd/system/$unit.d/agent-vm.conf" <<UNIT
# agent-vm: this stage runs in agent-vm-cloud-init.service's Python process
# (or, without it, as Debian's unit runs it).
[Unit]
Wants=agent-vm-cloud-init.service
After=agent-vm-cloud-init.service

[Service]
ExecStart=
ExecStart=/usr/lib/agent-vm/cloud-init-stage $stage $*
UNIT
}
stage cloud-init-local.service local /usr/bin/cloud-init init --local
stage cloud-init.service network /usr/bin/cloud-init init
stage cloud-config.service config /usr/bin/cloud-init modules --mode=config
stage cloud-final.service final /usr/bin/cloud-init modules --mode=final

# QEMU fw_cfg carries secrets as systemd credentials; load its driver early.
mkdir -p "$root/etc/modules-load.d"
echo qemu_fw_cfg > "$root/etc/modules-load.d/agent-vm.conf"

# Agents install packages; apt's daily timers would take the dpkg lock from
# under them (and cost CPU under TCG).
chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer

# The image keeps the package lists of its build (mmdebstrap runs with
# --skip=cleanup/apt): a first boot that installs a package (the
# repository's packages, create --packages) then needs no apt-get update,
# which is over a minute under TCG (16 MB of lists through the VM's proxy,
# then apt's cache built from them). ensure-packages uses them while they
# are younger than a day (by the stamp written here), as apt's daily update
# would. Kept: the lists and the package cache, made here in
# the guest's own paths (mmdebstrap's apt ran outside, with the build
# directory's); not kept: the downloaded packages and the source cache.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/archives/partial/* "$root"/var/cache/apt/*.bin
chroot "$root" apt-cache gencaches
rm -f "$root"/var/cache/apt/srcpkgcache.bin
mkdir -p "$root/var/lib/agent-vm"
touch "$root/var/lib/agent-vm/package-lists"

# Every VM gets its own host key (cloud-init installs the pinned one); the
# image carries none.
rm -f "$root"/etc/ssh/ssh_host_*
