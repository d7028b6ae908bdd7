// Package qemu is the launcher every QEMU-based backend shares: it turns a
// Machine into a QEMU command line (small pure functions, golden-tested),
// starts virtiofsd and QEMU detached from the CLI, answers what state a VM is
// in from its pid and QMP, and stops it (ACPI, then QMP quit, then SIGKILL to
// a PID proven to be this VM's QEMU).
//
// Two boot styles share all of that: Direct (agent-vm builds the whole QEMU
// command line: the cloud-init backend) and Script (a program such as
// nixpkgs' run-<name>-vm builds its own and takes the launcher's part as
// extra arguments: the NixOS backend).
//
// # The workspace share and its cache
//
// The workspace reaches the guest over virtiofs (virtiofsd, started here)
// or, on a host without virtiofsd, 9p. virtiofsd's cache mode
// (driver.Share.Cache, `create/start --workspace-cache`) decides how long
// the guest trusts what it read of the host's files, which is what small
// files cost: every stat the guest cannot answer from its cache is a round
// trip to virtiofsd.
//
//   - auto (the default): names and attributes are trusted for 1 s and a
//     file's cached pages are dropped when it is opened again, so an edit,
//     a new, renamed or deleted file on the host shows in the guest within
//     about a second. `git status` in a tree the guest looked at a second
//     ago asks the host again for every file.
//   - always: names, attributes and pages are trusted for a day. Fastest,
//     but an edit on the host (or a file it renames or deletes) may not
//     show in the guest until the guest's cache drops it (memory pressure,
//     `echo 3 > /proc/sys/vm/drop_caches`): only for workspaces the host
//     does not touch while the VM runs.
//   - none: nothing is cached, every access asks the host, and files are
//     opened for direct I/O, which the guest's kernel (6.1) refuses to map
//     shared (mmap MAP_SHARED fails: some databases and build tools break).
//
// What the guest writes is written through to the host in every mode (no
// -o writeback: with it the guest keeps a file's size and mtime as its own
// and can miss the host's truncations). QEMU 7.2's C virtiofsd runs
// without a thread pool (--thread-pool-size=0, its default): with one, its
// own seccomp filter kills the pool threads (sched_getaffinity, called by
// Debian 12's GLib) and the workspace hangs in the guest.
//
// bench P6 measures the modes side by side (BENCH_P6_MODES; results in
// bench/results/2026-11-23-6a896d6-p6-cache-modes.md: TCG, 2 cores, one
// round at load 13 falling to 4, so rough): workspace time over the
// guest's disk for untar of 5.7k files / warm `git status` was auto
// 4.4x / 5.8x, always 3.1x / 3.2x, none 5.3x / 13.4x. always is the
// fastest and is not the default because it does not show host edits;
// `TestWorkspaceSeesHostEditsAndHostSeesGuests` (package vm) checks that
// auto does.
package qemu

import (
	"fmt"
	"path/filepath"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/sockdir"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
)

// Machine is what the launcher needs to know about one VM: the
// driver-neutral description and where its sockets live.
type Machine struct {
	driver.Machine
	// SocketDir holds the QMP and virtiofsd sockets. It is RunDir unless
	// that path is too long for a unix socket (see SocketDirFor).
	SocketDir string
	// EgressDir holds the egress proxy's sockets, which QEMU's guestfwd
	// relays connect to. It is SocketDir unless QEMU drops to another user
	// (-runas), whose relays could not reach a directory of the caller's:
	// then the launcher sets it to its egressDir.
	EgressDir string
}

// Boot is how to start the VM: exactly one of Direct and Script is set.
type Boot struct {
	Direct *Direct
	Script *Script
}

// Direct is a VM whose whole QEMU command line agent-vm builds.
type Direct struct {
	Disks []Disk
	// MAC of the virtio NIC; empty means QEMU's default for the first NIC.
	MAC    string
	Kernel string // direct kernel boot when set
	Initrd string
	Append string
}

// Disk is a virtio disk.
type Disk struct {
	Path     string
	Format   string // qcow2, raw
	ReadOnly bool
}

// Script is a program that starts QEMU itself (nixpkgs' run-<name>-vm) and
// passes its arguments on to QEMU. Its own command line already sets memory
// (shared memory for virtiofs included), CPUs, disks and the forwarded ports.
type Script struct {
	Path string
	// Env is the script's whole environment: nothing of the caller's is
	// inherited, since the run script reads variables (SHARED_DIR,
	// QEMU_OPTS, QEMU_NET_OPTS, ...) that would change the VM.
	Env []string
	// Netdev is the id of the user-mode netdev the script's command line
	// makes ("user.0" in nixpkgs' qemu-vm.nix), where forwards added while
	// the VM runs go.
	Netdev string
	// Forwarded are the host ports the script's own command line forwards;
	// the launcher adds the machine's other forwards (see ScriptNetOpts).
	Forwarded []int
}

// Files the launcher keeps in RunDir and LogsDir.
const (
	PidFile       = "qemu.pid"
	VirtiofsdPid  = "virtiofsd.pid"
	LaunchFile    = "launch.json"
	CleanMarker   = "clean-shutdown"
	QMPSocket     = "qmp.sock"
	VirtiofsdSock = virtiofsd.SocketFile
	ConsoleLog    = "console.log"
	QEMULog       = "qemu.log"
	VirtiofsdLog  = virtiofsd.LogFile
)

func (m Machine) runFile(name string) string  { return filepath.Join(m.RunDir, name) }
func (m Machine) logFile(name string) string  { return filepath.Join(m.LogsDir, name) }
func (m Machine) sockFile(name string) string { return filepath.Join(m.socketDir(), name) }

func (m Machine) egressFile(name string) string {
	if m.EgressDir != "" {
		return filepath.Join(m.EgressDir, name)
	}
	return m.sockFile(name)
}

func (m Machine) socketDir() string {
	if m.SocketDir != "" {
		return m.SocketDir
	}
	return m.RunDir
}

// ConsoleLogPath is where the guest's serial console is written.
func (m Machine) ConsoleLogPath() string { return m.logFile(ConsoleLog) }

// QEMULogPath is where QEMU's own messages go.
func (m Machine) QEMULogPath() string { return m.logFile(QEMULog) }

// QMPPath is the QMP socket.
func (m Machine) QMPPath() string { return m.sockFile(QMPSocket) }

func (m Machine) validate() error {
	switch {
	case m.Name == "" || m.UUID == "" || m.RunDir == "" || m.LogsDir == "":
		return fmt.Errorf("internal error: incomplete machine %+v", m)
	case m.CPUs < 1 || m.MemoryMiB < 128:
		return fmt.Errorf("VM size %d CPUs, %d MiB is not bootable", m.CPUs, m.MemoryMiB)
	}
	return nil
}

// maxSocketPath keeps unix socket paths under the kernel's limit (see
// sockdir).
const maxSocketPath = sockdir.MaxPath

// SocketDirFor returns where a VM's sockets live (sockdir.For): its run dir
// when the paths fit a unix socket, else a private directory under
// $XDG_RUNTIME_DIR (or the temp dir) named after the VM's UUID. It only
// computes the path; Start creates it.
func SocketDirFor(runDir, uuid string) string { return sockdir.For(runDir, uuid) }

// ensureSocketDir creates the socket directory (sockdir.Ensure).
func ensureSocketDir(m Machine) error { return sockdir.Ensure(m.socketDir(), m.RunDir) }
