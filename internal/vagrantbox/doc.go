// Package vagrantbox makes a vagrant-libvirt box from an agent-vm base image
// and adds it to a VAGRANT_HOME, so the vagrant backend never downloads a
// box. Its real test (TestRealVagrantUpUnderLibvirt) is the proof
// the vagrant driver stands on; what it found is written down below.
//
// # The box
//
// A box is a tar of box.img (the image's qcow2 disk), metadata.json
// ({"provider":"libvirt","format":"qcow2","virtual_size":GiB}, vagrant-libvirt's
// v1 box format) and a Vagrantfile. agent-vm's built images have no
// bootloader: the disk is a whole-disk ext4 (root=/dev/vda, no partition
// table) booted with the kernel and initrd beside it. So the box carries
// vmlinuz and initrd.img too, and its Vagrantfile (static, embedded) sets
// vagrant-libvirt's kernel, initrd and cmd_line domain options (present in
// vagrant-libvirt 0.11.2, Debian 12's) from agent-vm-box.json, which agent-vm
// writes: no value is spliced into Ruby. A Vagrantfile of the user's that
// sets cmd_line replaces the box's, root=/dev/vda included. The alternative,
// a bootloader in the box (GRUB or systemd-boot on a partitioned copy of the
// disk), would need loop devices or a helper VM at build time and a second
// root layout; not worth it while libvirt boots kernels directly. (Other
// providers, VirtualBox among them, cannot boot a kernel directly: this box
// is libvirt's only.)
//
// Identity: the box is named agent-vm/<image name> and versioned
// <created unix seconds>.<first 32 bits of the disk's sha256, decimal>, both
// from the image's manifest: a rebuilt image is a newer version, the same
// image always the same version, and vagrant's version constraints work.
// Add passes vagrant a catalog (box metadata JSON with a file:// URL and the
// box's sha256), the one way to give a local box a version. An uncompressed
// tar costs one copy of the disk; `vagrant box add` unpacks it (a second) and
// the first `vagrant up` uploads box.img into the libvirt storage pool as
// the volume PoolVolume names (a third, kept by libvirt until deleted:
// `vagrant box remove` does not remove it).
//
// Under qemu:///system QEMU runs as libvirt-qemu and opens the kernel and
// initrd by their paths inside VAGRANT_HOME: every directory above them must
// be searchable by others (CheckQEMUCanRead); a VAGRANT_HOME under /root or a
// 0700 home directory (Debian 12's adduser default) fails at domain start
// with "could not open kernel file ... Permission denied" (reproduced).
//
// # What the real run found (Debian 12: vagrant 2.3.4, vagrant-libvirt 0.11.2, libvirt 9.0.0, QEMU 7.2)
//
// Works, under TCG (libvirt domain type "qemu", `libvirt.driver = "qemu"`;
// KVM aborts QEMU on this machine, and the accel probe decides), with the
// libvirtd fixture's own daemons (internal/testutil/libvirtd) and no systemd:
// box add, up, ssh, suspend, status, resume, halt, destroy. Timings of four
// runs, on 2 cores shared with other VM tests (notes, not promises):
//
//	vagrant box add (tar + add, 1.3 GiB)          11-15 s
//	vagrant validate                               1-2 s
//	vagrant up, first (box upload into the
//	  pool ~30 s, boot, cloud-init, SSH, virtiofs) 110-163 s
//	vagrant ssh -c                                 3-7 s
//	ssh through the forwarded port                 1.5-2.4 s
//	vagrant suspend (pause)                        1.3-3.4 s
//	vagrant status --machine-readable              1-3 s
//	vagrant resume                                 3.5-8.4 s
//	vagrant halt                                   29-74 s
//	vagrant destroy -f                             2.7-7.7 s
//
// Every vagrant command costs 1-4 s of Ruby start-up before it does
// anything, so the driver should run `vagrant ssh-config` once per boot and
// SSH itself (as the test's pinned-key ssh does), and cache status.
//
// The guest's identity: vagrant-libvirt attaches no cloud-init seed, but
// `libvirt.storage :file, device: :cdrom, path: SEED` attaches agent-vm's
// NoCloud ISO (internal/iso9660, label cidata) as an IDE CD-ROM (hda, on
// the default i440fx machine; q35 has no IDE: pass bus: "sata" there), and
// the image's cloud-init finds it (/dev/sr0). User, authorized key and the
// pinned host key (ssh_keys) all arrive that way; vagrant then logs in with
// config.ssh.username/private_key_path and insert_key = false.
//
// Networking: vagrant-libvirt needs its management network. Its ssh_info
// is the guest's address from the network's DHCP leases (or from a qemu
// guest agent, which the image lacks), so a user-mode NIC alone leaves
// vagrant nothing to SSH to. On first up it defines and starts
// "vagrant-libvirt" (192.168.121.0/24, NAT, a bridge, dnsmasq, iptables
// rules) and destroy of its last domain removes it. Consequences for the
// driver: root-equivalent host changes (a bridge, iptables) are unavoidable
// with qemu:///system; the guest reaches the host's 192.168.121.1 and,
// through NAT, everything the host reaches (the containment the QEMU backend has must be
// rethought for this backend: management_network_mode "none" renders the
// network without a <forward>, isolated but for the host's bridge address,
// and is worth a test); with qemu_use_session vagrant-libvirt still reads
// the leases from a network on the system connection (system_uri), so
// qemu:///session does not remove the need for a system libvirtd.
//
// Forwarded ports: vagrant-libvirt forwards with `ssh -L host_ip:port:guest:port`
// processes it spawns (pids in the dotfile's machine dir), through the
// guest's sshd, with StrictHostKeyChecking=no, and does not wait for them
// (`vagrant up` may return before the port listens; a port taken by
// someone else only shows in the forwarder's log, logs/ssh-forwarding-*.log
// in the machine's data directory). A forward with id "ssh" is
// skipped unless libvirt.forward_ssh_port is set: give agent-vm's SSH
// forward another id. Suspend clears the forwards, resume starts them again.
// Host ports up to 1024 make it run that ssh under sudo.
//
// Suspend: suspend_mode "pause" (the default) pauses the vCPUs; QEMU keeps
// the RAM; status says "paused". suspend_mode "managedsave" saves RAM to
// disk and stops QEMU, but libvirt refuses it while a 9p or virtiofs share
// is mounted ("Migration is disabled when VirtFS export path ... is
// mounted"; vhost-user-fs is not migratable), and then `vagrant suspend`
// prints the error and exits 0 with the domain still running: the driver
// must check the state after suspend. Without shares managedsave works
// (tried by hand, not in the test): suspend 6 s, QEMU exits, a 280 MB save
// file under /var/lib/libvirt/qemu/save for a 1 GiB guest, resume 14 s with
// uptime and /tmp intact. A managed-saved domain reads "shutoff" in vagrant
// status, like a halted one; only `virsh domstate --reason` tells them
// apart ("shut off (saved)").
//
// Crash: a SIGKILLed QEMU leaves the domain "shut off (crashed)" in
// `virsh domstate --reason`, but vagrant status says "shutoff" again (it
// reports "inaccessible" only for a running domain with no address). So
// the driver reads crashes from libvirt (domain name from the dotfile's
// machine id, or `virsh domstate`), not from vagrant. `vagrant up`
// recovers it (a full boot: 225 s here, under load).
//
// Concurrency: vagrant locks each machine for the length of an action; a
// second command meanwhile fails at once ("An action 'up' was already
// running"). The driver serialises its vagrant commands per VM.
//
// Halt: graceful (the guest's `shutdown -h now` over SSH, then up to
// graceful_halt_timeout, 60 s), 42-74 s under load here; `vagrant halt
// --force` (libvirt's forced power-off) is the fast path when the guest
// needs no flush.
//
// Synced folders: virtiofs works (type: "virtiofs" plus
// `libvirt.memorybacking :access, mode: "shared"` and
// `libvirt.memorybacking :source, type: "memfd"`): libvirt finds Debian 12's
// C virtiofsd through /usr/share/qemu/vhost-user/50-qemu-virtiofsd.json, no
// <binary path> needed. It runs as root with no uid mapping, so the guest's
// dev (uid 1000) writes as host uid 1000: the workspace owner's uid must be
// dev's, as the guest contract already says. (agent-vm's own sharejail does
// not wrap it: a difference from the QEMU backend.) 9p works too (type:
// "9p", accessmode "mapped"), but QEMU runs as libvirt-qemu, so files the
// guest creates belong to libvirt-qemu on the host ("passthrough" needs
// QEMU as root): virtiofs is the choice, 9p a fallback, rsync the last
// resort. vagrant mounts both itself over SSH (sudo mount -t virtiofs
// <md5 of host path, 31 chars> <guest path>).
//
// Files QEMU opens under qemu:///system: libvirt chowns to libvirt-qemu
// (and back afterwards) the files its domain XML names (kernel, initrd,
// disks, the seed CD-ROM, a file serial console), never their directories,
// and nothing passed through libvirt.qemuargs: a `-fw_cfg
// name=...,file=TOKEN` for the MCP token fails with "can't load ...:
// Permission denied" while TOKEN is root's 0600 file, and works once it
// belongs to libvirt-qemu (tried with virsh). So the VM directory must be
// searchable by others and the token file given to libvirt-qemu, 0600.
//
// Other pitfalls: every vagrant command loads the Vagrantfile of its
// working directory or VAGRANT_CWD (and its parents), so run vagrant with
// VAGRANT_CWD set, also for `box add`; vagrant's progress output is
// \r-separated and megabytes long during the box upload: filter it before
// it reaches a terminal or a log; the serial console goes to a file with
// `libvirt.serial type: "file", source: {path: ...}` (then `virsh console`
// is unavailable); libvirt's domain name is <project dir>_<machine>, so
// two VMs whose Vagrantfile directories share a base name collide unless
// the Vagrantfile sets libvirt.default_prefix (or the directories differ).
package vagrantbox
