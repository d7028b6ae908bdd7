// Package vagrant is agent-vm's second machine driver (internal/driver):
// Vagrant, with the libvirt provider (vagrant-libvirt), owns the machine's
// whole lifecycle, and agent-vm drives it through the vagrant command line.
//
// # Backend and driver
//
// What the guest is belongs to a backend: the vagrant backend
// (internal/vagrantbackend) is the Debian guest of the qemu backend, made an
// agent-vm guest by the same cloud-init NoCloud seed (internal/cloudinit:
// user dev, the pinned host key, the agent-mcp unit, packages, the agent
// CLI, the repository's provisioning), booted from a Vagrant box instead
// of a QEMU overlay: agent-vm's own box (DefaultBox, made from its base
// image, so nothing is downloaded) or a public one (create --box NAME).
// Its plan (Boot) names the box, the seed ISO, the NIC's MAC the seed's
// network config matches, and the SSH user and key.
//
// How it runs belongs to this driver: it renders the Vagrantfile from the
// machine (CPUs, memory, forwards, workspace, credentials, console log),
// the plan and the start's accelerator, and runs vagrant up, resume, halt,
// suspend, destroy -f and status. The Vagrantfile is agent-vm's unless
// the repository has its own (next section): it lives in the VM's state
// directory, <vm>/run/vagrant/, and is rewritten at every start (create
// writes it first, so it can be read and checked with `vagrant validate`
// before any start).
//
// Reuse of the cloud-init seed rather than a shell provisioner:
// vagrant-libvirt attaches a file as a CD-ROM (libvirt.storage :file,
// device: :cdrom), and cloud-init's NoCloud finds its seed on any block
// device labelled cidata, so the guest's whole first boot is the one the
// qemu backend tests; the MCP token reaches the guest through QEMU's fw_cfg
// as for the qemu backend (libvirt.qemuargs), never on a command line. The
// only shell provisioner is static text: it starts the workspace and
// agent-mcp units again should they have failed at boot.
//
// # The repository's own Vagrantfile
//
// When the repository create runs in has a Vagrantfile at its root and
// --vagrantfile is auto (the default) or repo, the machine is that file's,
// run as is (seed 000: "existing Vagrantfile respected"); --vagrantfile
// generate takes agent-vm's own whatever the repository has. agent-vm
// never writes, moves or touches the file. Every vagrant command then runs
// with VAGRANT_VAGRANTFILE=<the file, absolute> and VAGRANT_CWD=<the VM's
// workspace>, so the file's relative paths (its "." synced folder, a
// provisioner's path:) are the branch's clone, not the user's checkout,
// while VAGRANT_DOTFILE_PATH and VAGRANT_HOME stay agent-vm's, per VM: the
// repository's own .vagrant/ is never read or written, and a machine the
// user brought up there with plain `vagrant up` is another machine. The
// provider is the file's (or the user's VAGRANT_DEFAULT_PROVIDER): no
// --provider, no VAGRANT_DEFAULT_PROVIDER. UserFile in the project
// directory records the file, the directory and the machine; its presence
// is what makes a machine the user's (MachineName, Env).
//
// Why the file in the user's checkout and not the workspace's copy: vagrant
// evaluates the Vagrantfile, Ruby, on the host at every command (status
// included), and the workspace is the guest's to write; running the
// workspace's copy would hand the guest code execution on the host. The
// checkout's file is the user's. For the same reason a Vagrantfile that is
// a symlink is followed only within the repository (FindUserVagrantfile);
// one leading out of it, nowhere, or to a directory is refused with the
// fix, at create and again at every start. A file gone since create stops
// every vagrant command with the fix (restore it) before vagrant runs;
// only a machine vagrant never made (no id in the dotfile directory) is
// destroyed without it.
//
// One machine: create asks vagrant (`vagrant status --machine-readable`,
// with the VM's own dotfile directory) which machines the file defines and
// refuses several, naming them (OneMachine), rather than picking the
// `primary` one: agent-vm runs one VM per branch, and driving one machine
// of several would leave the others started by a bare `vagrant up` and
// stopped by nobody; the machine-readable status does not say which one is
// primary either.
//
// What such a machine lacks, because its guest is not agent-vm's: no
// cloud-init seed, so no agent-mcp, no pinned host key, none of agent-vm's
// provisioning (its user, agent CLI, packages, provision.sh); the forwards
// and synced folders are the file's (no port choice, no /workspace unless
// the file shares it); no network containment (its networks are the
// file's). The orchestration calls such a guest foreign (state.Guest.
// Foreign): start waits for `vagrant up` alone, and SSH is what `vagrant
// ssh-config NAME` says (ForeignSSH, parsed by ParseSSHConfig: vagrant's
// key, no host key to check), which `agent-vm ssh-config` prints for
// OpenSSH; agent-vm's own exec and shell, which pin the host key, refuse
// it with that hint. A ProxyCommand (a remote libvirt host) is refused.
//
// # Vagrantfile content
//
// The default /vagrant share is disabled and the workspace is no synced folder
// (next section). The SSH and MCP forwards are bound to 127.0.0.1
// (forward_ssh_port: vagrant-libvirt forwards port 22 only when asked). Vagrant
// logs in as the guest user with the VM's own client key and never inserts a key
// of its own. The libvirt domain is named after the machine (no prefix), which is
// unique per VM; the domain type is "kvm", or "qemu" (TCG) when the start's
// accelerator says KVM is unusable. The box is agent-vm's own by name and version
// (internal/vagrantbox, which the backend adds to VAGRANT_HOME on the first
// start) or the user's --box.
//
// # The workspace share
//
// vagrant-libvirt's virtiofs synced folder has libvirt (libvirt 9.0 under
// qemu:///system) start its own virtiofsd, as root and without uid
// mapping: the guest's root made root-owned files in the workspace on the
// host (the integration test's escape step). libvirt 9.0 can point a
// virtiofs filesystem at an externally started virtiofsd's socket, but
// vagrant-libvirt 0.11.2 writes only source dir= for its synced folders.
// So the driver starts virtiofsd itself, as the QEMU driver does
// (package virtiofsd: QEMU's C virtiofsd, as root in agent-vm's jail,
// package sharejail, as the workspace's owner) on <run>/virtiofsd.sock
// before `vagrant up` (startShare), makes that socket 0600 and libvirt's
// QEMU user's (an ACL entry when agent-vm is not root), and the
// Vagrantfile adds the device through libvirt.qemuargs: -chardev socket
// and -device vhost-user-fs-pci with tag "workspace" in PCI slot 30
// (libvirt hands out its own slots from 2 without knowing of qemuargs'),
// with memfd shared memory backing. The guest's agent-vm-workspace unit
// mounts it at boot, as for the qemu backend. virtiofsd exits when QEMU
// closes the connection (halt, destroy, a crash); the driver also ends one
// serving this socket before every `vagrant up` (a crash's leftover),
// after a failed start, a stop and a destroy. A pause keeps both running.
// No 9p: libvirt's 9p writes as libvirt-qemu, not the owner. As root, a
// virtiofsd that cannot be jailed (the Rust one, or an unknown owner) is
// refused with the fix. A repository's own Vagrantfile shares what it
// says through vagrant: not covered.
//
// Suspend is suspend_mode "pause": libvirt refuses managedsave while a
// virtiofs or 9p share is mounted (and the workspace always is), and then
// `vagrant suspend` exits 0 with the machine still running; so the driver
// reads the state again after every suspend and fails when it did not
// happen. A paused machine still holds its memory on the host, which
// Inspect's detail says.
//
// Files QEMU opens: under qemu:///system libvirt runs QEMU as libvirt-qemu and
// hands it the files its domain XML names (the box's disk and kernel, the seed),
// never their directories nor files passed through qemuargs. So each credential
// is copied into a fw_cfg directory as a 0600 file of libvirt-qemu (as root; else
// readable by it through a POSIX ACL entry), and the virtiofsd socket is handed
// over alike (internal/qemuuser, which a driver that runs QEMU through libvirt
// shares). As root (whose state directory is under /root, 0700) those copies, a
// copy of the seed and the socket go to the machine's own directory in a handoff
// directory outside home directories (Driver.Handoff,
// /var/lib/agent-vm/libvirt/<machine>, 0711, removed by Destroy) and the VM's
// directories stay closed; VAGRANT_HOME is /var/lib/agent-vm/vagrant. Without a
// handoff directory (not root) Start makes the state directory, the VM's and its
// run directory searchable (not readable) by others. The console log stays in the
// VM's logs directory: libvirt hands a file-backed serial port to virtlogd, which
// runs as root (libvirt's default stdio_handler "logd"; seen: virtlogd holds the
// file open, QEMU a pipe). Either way every path is checked with
// vagrantbox.CheckQEMUCanRead, so a 0700 directory above fails at once with the
// fix instead of libvirt's "Permission denied".
//
// Network: the driver contains it (a driver.NetworkContainer), as the QEMU
// driver does, with what internal/libvirtnet makes and undoes
// (libvirtnet.Containment; the driver checks for root and names the
// network after the machine): before `vagrant up`, a libvirt network of
// the VM's own (isolated: no forward; its own bridge and /29; DHCP
// reserving the guest's address for its MAC and handing out one route, to
// the proxy address 10.0.2.100 by way of the bridge; no DNS), the VM's
// egress proxy (`agent-vm net-proxy`, the same program and policy as for
// QEMU) with its TCP front on the bridge's address (egress.Front: the
// proxy and each exposed port on ports the kernel chooses, written to
// egress-front.json in the run directory), and the nftables table that
// leads the guest's connections to 10.0.2.100 there and drops everything
// else it sends the host. The Vagrantfile names the network
// (management_network_name and _address, mode "none", keep:
// vagrant-libvirt attaches the NIC to it and never removes it), so vagrant
// still finds the guest's address in its DHCP leases and SSHes to it. So
// the guest's contract (its proxy settings, the proxy address) is the
// qemu backend's, and so is its seed. Stop, destroy and a failed start end
// the proxy and remove the table and the network (a marker in the run
// directory says a start made them; a crash leaves them to the next start,
// which makes them afresh, or to the stop). A pause keeps them. Making a
// bridge and a table needs root: a contained start as another user is
// refused before vagrant runs, with the fix. As root the proxy drops to
// the workspace's owner once it listens. A repository's own Vagrantfile
// runs on the networks it says and is not contained (the orchestration
// says so); nothing is passed to it.
//
// Every value in the file goes through one escaper, RubyString: a
// double-quoted literal in which every byte outside printable ASCII is
// \xNN and ", \ and # are backslash-escaped. Double quotes, because a
// single-quoted literal cannot carry NUL, ^D or ^Z (Ruby's lexer ends the
// program there) nor invalid UTF-8 (a syntax error in a UTF-8 source);
// escaping # keeps #{...}, #@x and #$x from interpolating. Integers are Go
// ints. Paths that vagrant-libvirt splices unescaped into the domain XML
// (the seed, the console log, fw_cfg files) are refused when they hold an
// XML metacharacter or a quote.
//
// # Vagrant's state, per VM
//
// For agent-vm's own Vagrantfile, every vagrant command runs with
// VAGRANT_CWD=<vm>/run/vagrant (its
// Vagrantfile, VAGRANT_VAGRANTFILE=Vagrantfile whatever the user's
// environment says) and VAGRANT_DOTFILE_PATH=<vm>/run/vagrant/.vagrant (the
// machine's id, its forward processes, its logs), so two VMs never share
// machine state, and none is the user's own project. VAGRANT_HOME is
// agent-vm's (Driver.Home: /var/lib/agent-vm/vagrant as root, else
// <cache>/vagrant), not ~/.vagrant.d: it holds
// the boxes, which VMs share read-only (a box per VM would copy the base
// image each time), and vagrant's global machine index, whose entries are
// keyed by the per-VM dotfile path. VAGRANT_CHECKPOINT_DISABLE=1: no
// version check over the network. The libvirt domain name is the VM's
// machine name, agent-vm-<slug>-<id>, unique per host.
//
// # State and its cache
//
// State comes from `vagrant status --machine-readable`, parsed (see
// ParseMachineReadable), and, for a machine vagrant calls shutoff or
// paused, from libvirt's reason (`virsh domstate --reason`, DomState):
// vagrant says shutoff alike for a halted, a killed and a managed-saved
// machine. Mapped to the driver's states: running; paused; suspended
// (paused by agent-vm suspend, vagrant's saved, libvirt's "saved"); stopped
// (not created, shut off after an agent-vm stop, or libvirt's "shutdown":
// the guest powered off); crashed (aborted, libvirt's "crashed", or forced
// off without agent-vm stopping it), whose detail says `agent-vm start
// NAME` recovers it (vagrant up). agent-vm's markers in the run directory
// (a start's launch record, the clean-stop and suspend markers) decide where
// libvirt cannot say.
//
// One vagrant command per VM at a time: vagrant's own machine lock fails a
// second command at once, so every vagrant command but status takes a lock
// file in the run directory and waits for it (the orchestration's per-VM
// lock already serialises agent-vm's verbs). SSH is agent-vm's own, with
// the pinned host key, to the forwarded port. Never `vagrant ssh`.
//
// # Forwarded ports
//
// vagrant-libvirt forwards a port with an `ssh -L` process it spawns once
// the guest answers and does not wait for: when another program holds the
// host port, that forwarder exits, `vagrant up` still succeeds, and the
// port reaches the other program (seen: another VM's SSH forward). So
// Start and Resume check every port free on 127.0.0.1 before vagrant runs
// (ports.CheckForward, as the QEMU launcher does), first ending the
// forwarders a crashed run of this machine left (vagrant up does not; they
// would hold the ports), and after vagrant returned wait until the
// forwarder vagrant recorded (<dotfile>/machines/NAME/libvirt/pids) is the
// process listening on each port (/proc/net/tcp and its descriptors); a
// port held by another program fails the start (the machine is halted)
// saying so and what to do. The orchestration's pinned host key is the
// last guard: a mismatch says the port is held by another program.
//
// A vagrant status costs one to three seconds (Ruby and its plugins load
// every time), so Inspect answers from a per-VM cache file for CacheTTL,
// 15 s, rather than seed 000's 60 s: that seed polled from a long-lived
// TUI, while agent-vm is a command people run again within seconds (list,
// then status) and expect to see a crash in at once; 15 s keeps a burst of
// list/status/exec at one vagrant run while a crash shows within 15 s.
// Every lifecycle verb agent-vm runs (start, stop, suspend, resume,
// destroy) reads vagrant's state afresh and drops the cache; a cached
// running or paused machine is checked with `virsh domstate` (tens of
// milliseconds), so a killed one is read afresh at once. A running
// machine's pid is its QEMU's, from libvirt's pid file (root only).
package vagrant
