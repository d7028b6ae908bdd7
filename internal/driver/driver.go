// Package driver is the contract between the orchestration (internal/vm)
// and the ways agent-vm runs machines: how a machine runs, as opposed to
// what its guest is (a backend, internal/backend). A backend prepares a
// guest (disks, seed, nix build) and says how to boot it; a driver boots
// it, watches it and stops it. internal/qemu implements it today (the QEMU
// launcher, for the Debian and NixOS backends); internal/vagrant, which
// owns its machines' whole lifecycle through vagrant, is the second.
// Neither imports the other: what both need (virtiofsd, the process
// table) is in packages of its own (internal/virtiofsd, internal/proc).
//
// Every driver implements the core, Driver. What only some drivers can do
// is an interface of its own, which the caller finds by a type assertion
// and does without, with its own refusal, when a driver lacks it:
// Suspender, Pauser, Hibernator, Cloner, Forwarder, Adopter and NetworkContainer. A driver
// keeps a compile-time check for each one it implements (var _
// driver.Cloner = (*Driver)(nil)). A capability a driver has may still be
// refused for one machine, with ErrUnsupported (the QEMU driver suspends
// no NixOS run script's machine): that is a property of the machine.
//
// What each verb guarantees, the core's first:
//   - Inspect reads a machine's live state from the host side only (process
//     table, the driver's own run files and control channels), never from
//     the guest, so it is fast and answers for a guest that hangs.
//   - Start launches a machine per a plan and returns once it is launched
//     (for QEMU: once it answers on QMP); the guest boots after that and
//     the caller waits for it (SSH, agent-mcp). A failed Start leaves
//     nothing of itself running; a machine already alive is ErrRunning.
//   - Stop shuts a machine down cleanly (the guest powers off), and after
//     grace forces it; ErrNotRunning when there was nothing to stop (what
//     a crash left is cleared all the same).
//   - MarkReady records that the guest of the current launch came up, and
//     Running tells whether a launched process is still that machine (the
//     boot watch), never mistaking a recycled pid for it.
//   - Destroy removes what the driver keeps for a stopped machine outside
//     its run and log directories.
//   - Logs names the log files: the guest's console and the driver's own.
//   - Share says which workspace share a start would attach on this host,
//     so the backend prepares its guest for it before Start; Doctor checks
//     the programs the driver needs.
//   - Suspender: Suspend keeps a running machine's memory while no guest
//     code runs, and Inspect then says StateSuspended, its detail saying
//     where the memory is. The QEMU driver saves memory and devices to the
//     run directory and ends its processes, so a suspended machine costs
//     no CPU or RAM; the vagrant driver pauses the machine, whose QEMU
//     keeps the memory (see internal/vagrant). The guest's side (what uses
//     the workspace share, which QEMU cannot save with the rest) is the
//     caller's: the driver calls GuestHooks.Detach once it knows it can
//     suspend, and GuestHooks.Attach to undo it when the suspend fails
//     after. A driver whose SuspendKeepsShare is true leaves the share
//     attached and runs neither hook.
//     Resume starts the machine again from that state, per the same plan
//     Start would take, with the share attached again; the caller then
//     mounts it in the guest (unless SuspendKeepsShare) and fixes the
//     guest's clock. A state that no longer fits (another QEMU, another
//     machine, a changed disk) is refused with ErrStaleState and kept;
//     Stop discards a saved state (a later Start boots cold).
//   - Pauser: Pause suspends a running machine in place: its CPUs stop,
//     its process keeps its memory and every device (the workspace share
//     stays mounted, so no guest hook runs and nothing has to be saved),
//     and Inspect says StateSuspended with Live.Suspend SuspendPaused.
//     Continue runs it again and returns its launch, the same process; the
//     caller waits for the guest and sets its clock as after a Resume. Stop
//     ends a paused machine (the QEMU driver continues it first, so its
//     guest powers off cleanly), and Start refuses it with ErrSuspended, as
//     a saved one. The QEMU driver, whose Suspend saves to disk, pauses
//     too, for a guest whose workspace is in use (see internal/vm); the
//     vagrant driver's Suspend always pauses, so it needs no Pauser.
//   - Hibernator: Hibernate pauses a running machine in place as Pause
//     does and moves the guest's memory to a file on disk, so that its
//     process holds its devices and its own memory only; Inspect says
//     SuspendHibernated, and Continue brings the memory back before the
//     CPUs run. A failed Hibernate leaves the machine running.
//   - Cloner: Clone starts a machine that never ran from another one's
//     saved state (a template), with edits in its memory.
//   - Forwarder: AddForward and RemoveForward change a running machine's
//     port forwards (`agent-vm port`). Every driver's Start applies
//     Machine.Forwards itself, so a forward kept in the record comes back
//     at every start.
//   - Adopter: Adopt completes a machine whose record is lost (no uuid)
//     from what still runs in its run directory, so Stop and Destroy reach
//     it. A driver without it needs nothing more than the run directory.
//   - NetworkContainer: Start honours Machine.Network; the caller gives a
//     Network only to a driver that does.
//
// Driver-neutral: the machine description (Machine), its states, Live,
// Launch and the workspace share modes, all here. Driver-specific: the boot
// plan (Boot), what Adopt learnt (Machine.Adopted, opaque to the caller),
// and everything behind the verbs (QEMU's command line, virtiofsd, QMP,
// socket directories stay in internal/qemu). The accelerator (KVM or TCG)
// is chosen by the caller and passed in StartOptions.
//
// How a plan travels: a backend names the driver it needs (Backend.Driver)
// and its Plan carries a Boot, a value of that driver's own plan type
// (qemu.Boot: a QEMU command line or a run script; vagrant.Boot: the box,
// seed and login its Vagrantfile is made with, or the repository's own
// Vagrantfile). The named driver type-checks it in Start and refuses a plan
// of another driver with an error naming both. A neutral plan type would be
// the union of every driver's (argv and disks mean nothing to Vagrant, a
// Vagrantfile nothing to QEMU), and generics cannot help: vm holds drivers
// of different plan types side by side. Boot is an interface with one
// method, rather than any, so that a plan says which driver it is for.
package driver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Driver runs machines: the core every driver implements. Every verb
// takes the machine's description; a driver keeps no state between calls
// other than its run files.
type Driver interface {
	// Name is the driver's name, as backends name it: "qemu".
	Name() string
	// Doctor checks the programs this driver needs on this host; ok is
	// false when it cannot run machines here.
	Doctor(ctx context.Context) (checks []Check, ok bool)
	// Share says how this host would share the workspace into a machine
	// started now, and why it is not the best mode when it is not (err).
	// The backend prepares its guest for that mode before Start.
	Share(ctx context.Context) (mode ShareMode, err error)

	Inspect(ctx context.Context, m Machine) (Live, error)
	Start(ctx context.Context, m Machine, b Boot, o StartOptions) (*Launch, error)
	Stop(ctx context.Context, m Machine, grace time.Duration) error
	Destroy(ctx context.Context, m Machine) error

	// MarkReady records that the guest of the current launch is up (the
	// time Launch.ReadyAt reports).
	MarkReady(m Machine, at time.Time) error
	// Running reports whether the machine launched as l still runs.
	Running(m Machine, l *Launch) bool
	Logs(m Machine) Logs
}

// Suspender is a driver that can suspend a running machine and resume it
// (see the package doc).
type Suspender interface {
	Suspend(ctx context.Context, m Machine, g GuestHooks) error
	Resume(ctx context.Context, m Machine, b Boot, o StartOptions) (*Launch, error)
	// SuspendKeepsShare says whether Suspend leaves the workspace share
	// attached and mounted in the guest (the vagrant driver pauses the
	// machine; QEMU's suspend unplugs the share, which it cannot save).
	// Such a driver's Suspend runs no GuestHooks, and after its Resume the
	// caller does not mount the share again.
	SuspendKeepsShare() bool
}

// Pauser is a driver that can suspend a running machine in place, its
// process keeping the memory and every device (see the package doc).
type Pauser interface {
	// Pause stops the CPUs of the running machine m: ErrNotRunning when it
	// does not run.
	Pause(ctx context.Context, m Machine) error
	// Continue runs the CPUs of m, which Pause paused, again and returns
	// its launch (as its start recorded it): ErrNotRunning when m is not
	// paused by Pause.
	Continue(ctx context.Context, m Machine) (*Launch, error)
}

// Hibernator is a Pauser that can also move a paused machine's memory to
// disk (see the package comment).
type Hibernator interface {
	Pauser
	// Hibernate pauses the running machine m and moves its memory to disk:
	// ErrNotRunning when it does not run, ErrUnsupported when its memory
	// is not one the driver can move (the machine runs on then).
	Hibernate(ctx context.Context, m Machine) error
}

// Cloner is a driver that can start a machine from a template's saved
// state (internal/template's templates).
type Cloner interface {
	// Clone starts m, which never ran, from the saved state of from (a
	// template: a machine Suspend saved), with m's own disks, share and
	// plumbing; the caller gives the guest its own identity. A template
	// that does not fit m (another QEMU, another machine shape, a changed
	// disk) is ErrStaleState, before anything starts. edits are made in
	// the restored memory before the guest runs; one that does not fit
	// (the memory does not hold its Old bytes) is ErrStaleState too.
	Clone(ctx context.Context, m Machine, b Boot, o StartOptions, from Machine, edits []MemoryEdit) (*Launch, error)
}

// Placer is a driver that runs machines on other hosts (Machine.Remote),
// each with a directory of its own there that holds its workspace.
type Placer interface {
	Driver
	// PrepareHost makes m's directory on its host and returns where the
	// workspace is to be cloned there (it must not exist yet).
	PrepareHost(ctx context.Context, m Machine) (workspace string, err error)
	// RemoveFromHost destroys m (as Destroy, which keeps m's directory on
	// the host: a reset keeps its workspace) and removes that directory,
	// the workspace with it.
	RemoveFromHost(ctx context.Context, m Machine) error
	// HostPaths are where m's files lie on its host.
	HostPaths(m Machine) HostPaths
}

// HostPaths are a placed machine's files on its host.
type HostPaths struct {
	Workspace string // the branch's clone the guest shares
	NetDir    string // the egress proxy's directory (policy, log)
}

// Forwarder is a driver that can change a running machine's port
// forwards.
type Forwarder interface {
	// AddForward forwards 127.0.0.1:f.Host on the host to f.Guest in the
	// running machine until it stops: ErrNotRunning when it does not run,
	// an error naming the port when the host port cannot be bound.
	AddForward(ctx context.Context, m Machine, f Forward) error
	// RemoveForward ends the forward of host port f.Host in the running
	// machine; a forward that is not there is no error.
	RemoveForward(ctx context.Context, m Machine, f Forward) error
}

// Adopter is a driver that learns from the host what a machine whose
// record is lost left running (the QEMU driver: where its sockets are).
type Adopter interface {
	// Adopt completes m (no uuid) from what runs in its run directory; m
	// is returned as it was when nothing does.
	Adopt(ctx context.Context, m Machine) Machine
}

// NetworkContainer is a driver whose Start honours Machine.Network (the
// containment: the guest reaches only its egress proxy and exposed ports). Both
// drivers are: QEMU's by its restricted user network, vagrant's by a libvirt
// network of the VM's own and an nftables fence (internal/libvirtnet). The caller
// passes no Network to a driver that is not, nor for a guest that is not
// agent-vm's (the repository's own Vagrantfile), and must not promise the user a
// policy nothing enforces.
type NetworkContainer interface {
	// ContainsNetwork does nothing: having it is the answer.
	ContainsNetwork()
}

// ForeignReacher is a driver that can say how to reach a guest made from
// the user's own configuration (a backend.Foreigner's foreign guest),
// which has no pinned host key of agent-vm's: `agent-vm ssh-config`
// prints its endpoint for OpenSSH.
type ForeignReacher interface {
	ForeignSSH(ctx context.Context, m Machine) (SSHEndpoint, error)
}

// Boot is a driver-specific boot plan (see the package doc).
type Boot interface {
	// DriverName names the driver that runs this plan.
	DriverName() string
}

// GuestHooks are the guest's side of a suspend (see Suspender), run by the
// caller over its own channel to the guest.
type GuestHooks struct {
	// Detach readies the guest for the workspace share to go (stops what
	// uses it, unmounts it). Its error refuses the suspend and is returned
	// as is.
	Detach func(ctx context.Context) error
	// Attach mounts the share again after a suspend failed past Detach.
	Attach func(ctx context.Context) error
}

// StartOptions are the driver-neutral choices of one start.
type StartOptions struct {
	Accel       string // "kvm" or "tcg"
	AccelReason string
	// Share is the mode Share answered, which the backend prepared for.
	Share ShareMode
	// FixedShare: the guest mounts exactly Share, so the driver must fail
	// rather than fall back to another mode.
	FixedShare bool
	// BootTimeout is how long the orchestration waits for the guest; a
	// driver whose tool waits for the guest itself (vagrant up) gives it
	// as long. 0 = the driver's own default.
	BootTimeout time.Duration
}

// MemoryEdit is a change a Clone makes in the guest's memory restored
// from its template, before the guest's CPUs run: New replaces Old at
// guest physical address Addr (internal/template gives each clone
// its own kernel boot id this way). What names it in errors.
type MemoryEdit struct {
	What     string
	Addr     uint64
	Old, New []byte
}

// Errors the verbs return (wrapped).
var (
	ErrRunning    = errors.New("already running")
	ErrNotRunning = errors.New("not running")
	// ErrUnsupported is a verb the driver cannot do: one it lacks the
	// capability of (the caller's refusal wraps it), or one it refuses
	// for this machine.
	ErrUnsupported = errors.New("not supported by this driver")
	// ErrSuspended is a Start of a machine that has a saved state: Resume
	// it, or Stop it to discard the state first.
	ErrSuspended = errors.New("suspended")
	// ErrStaleState is a saved state that no longer fits the machine.
	ErrStaleState = errors.New("the saved state no longer fits this machine")
)

// Check is one thing doctor looked at.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Hint   string `json:"hint,omitempty"`
}

// Logs are a machine's log files on the host.
type Logs struct {
	Console string // the guest's serial console
	Driver  string // the driver's own messages (QEMU's)
}

// PlanOf is b as the plan type T of the driver called name; another
// driver's plan (a backend naming the wrong driver) is an internal error
// naming both.
func PlanOf[T Boot](name string, b Boot) (T, error) {
	boot, ok := b.(T)
	if !ok {
		other := ""
		if b != nil {
			other = b.DriverName()
		}
		return boot, fmt.Errorf("internal error: the %s driver cannot run a plan for the %q driver (%T); the VM's backend names the wrong driver", name, other, b)
	}
	return boot, nil
}
