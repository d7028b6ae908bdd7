// Package backend is the contract between the orchestration (internal/vm)
// and the VM flavours (internal/cloudinit, internal/nixos): the interface a
// flavour implements and the types that cross it. It holds no logic, so
// flavours depend on it rather than on the orchestration above them.
package backend

import (
	"context"
	"errors"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Backend is one VM flavour: what the guest is. How it runs is a driver's
// (internal/driver), which the backend names; everything else (state, keys,
// ports, workspace) is shared.
type Backend interface {
	// Name is the backend's name as stored in the record: "qemu", "nixos".
	Name() string
	// Driver names the driver that runs this backend's VMs (and whose
	// plan type Plan.Boot is): "qemu".
	Driver() string
	// Release undoes, before the VM's directory is removed, what the backend
	// made that would outlive the directory half-removed (nixos: the
	// GC-root out-links, so nix may collect the VM's system).
	Release(l state.Layout) error
	// ImagesInUse lists the cached image files the VM in l depends on, so
	// `image prune` keeps them.
	ImagesInUse(l state.Layout) []string
	// Doctor says whether this host can run the backend's VMs, with the
	// checks that decided it (doctor prints them after the shared ones).
	Doctor(ctx context.Context) Readiness
	// CheckCreate refuses create flags this backend does not use, and bad
	// values of those it does, before anything is made. It may look at the
	// host (a --config file exists) but changes nothing.
	CheckCreate(f CreateFlags) error
	// Provision adds the backend's own files to a VM directory being
	// created and stores its section of the record (r.SetSection). l is the
	// staging layout; r is complete except for that section.
	Provision(ctx context.Context, l state.Layout, r *state.Record, f CreateFlags) error
	// Reset discards the VM's root disk (the VM is stopped; the caller
	// holds its lock), so that the next start boots a fresh one from the
	// base and provisions it again, with the same host key. It leaves the
	// workspace, the keys and the record's other fields alone, and refuses
	// (changing nothing) when the next start could not make a new disk
	// (the base image is gone). It may change its own section of r (the
	// caller saves the record).
	Reset(ctx context.Context, l state.Layout, r *state.Record) error
	// CheckStart refuses start flags this backend cannot honour, before
	// anything is done (also when the VM is already running).
	CheckStart(r *state.Record, f StartFlags) error
	// Prepare readies a VM for booting (disks, seed, nix build) and says how
	// to boot it. It may change its own section of r (the caller saves the
	// record when it did).
	Prepare(ctx context.Context, l state.Layout, r *state.Record, o PrepareOptions) (*Plan, error)
}

// Templater is a backend whose guests can start from a template
// (internal/template has the design): a VM of the same backend,
// provisioned with the guest contract alone and saved by its driver (a
// driver.Suspender and driver.Cloner), on whose disk Prepare makes a new
// VM's (PrepareOptions.Template) and then returns a Plan with a Clone. The
// record's section is the backend's, so the backend says what of it a
// template takes and must share.
type Templater interface {
	// TemplateSection is the section of the record of a template made for
	// the VM whose record is r.
	TemplateSection(r *state.Record) (any, error)
	// TemplateBase is what of r's section a template for r must have been
	// made with: a part of the template's key, compared as text.
	TemplateBase(r *state.Record) (string, error)
	// TemplateStale says why the template whose VM's directory is l and
	// record r is older than one built now would be, as far as the backend
	// knows (its disk made on a base image new VMs no longer boot), or "".
	TemplateStale(ctx context.Context, l state.Layout, r *state.Record) string
}

// Forker is a backend whose VMs can be forked (`agent-vm fork`): a new VM
// made from another's root disk as it is at that moment, which boots it as
// a new machine of its own (its first start gives the guest the new VM's
// identity: Plan.Adopt); and whose disks
// can be kept in a checkpoint and put back (`agent-vm checkpoint`,
// `rollback`).
type Forker interface {
	// ForkDisk gives the VM being made in to (its record nr, complete but
	// for the backend's section) a root disk of its own with the content
	// of from's (record r), which is stopped, saved or paused and stays
	// so meanwhile, and sets nr's section. A source that has never booted
	// has no disk: the fork then makes its own at its first start, as any
	// new VM. A failure leaves nothing of the fork's disk in to. The copy
	// is written, not synced (the source is held still the shorter): the
	// caller syncs to's filesystem before it puts the fork in place.
	ForkDisk(ctx context.Context, from state.Layout, r *state.Record, to state.Layout, nr *state.Record) (DiskFork, error)
	// RestoreDisk gives the stopped VM in to (its record r) a copy of the
	// disk ForkDisk copied into from (a checkpoint of that VM) in place of
	// its own, or no disk when from has none (the next start makes one).
	// The VM's own disk is replaced at once or not at all.
	RestoreDisk(ctx context.Context, from state.Layout, r *state.Record, to state.Layout) (DiskFork, error)
}

// DiskFork says what ForkDisk copied.
type DiskFork struct {
	// Bytes is the size of the disk copied (0: the source had none).
	Bytes int64
}

// Foreigner is a backend whose VMs may run a guest made from the user's
// own configuration, run as is (the vagrant backend: the repository's own
// Vagrantfile). Such a guest has none of agent-vm's guest side: no
// agent-mcp, no pinned host key (the driver's driver.SSHEndpoint reaches
// it), no holder, no guest steps at a start or resume, no network
// containment, and create's size, port and origin flags do not apply (its
// configuration sets them). The backend says which VMs run one; vm asks
// this, never which backend or file made the guest, and a backend that is
// no Foreigner runs only agent-vm's own guests.
type Foreigner interface {
	// Foreign describes the guest of the VM whose record is r, when it is
	// foreign (ok).
	Foreign(r *state.Record) (f Foreign, ok bool)
}

// Foreign is a foreign guest as its backend describes it, for what agent-vm
// tells the user.
type Foreign struct {
	// Config is the configuration the guest is made from (a path).
	Config string
	// Lacks is what agent-vm cannot give the VM, one line each; create
	// prints them.
	Lacks []string
	// Reach says how to reach the guest instead of agent-vm's own ways in,
	// and Own how to get agent-vm's own guest instead (hints).
	Reach, Own string
	// NoKVM is what a start without KVM tells the user (the configuration
	// chooses the accelerator); "" for nothing.
	NoKVM string
}

// HostNeeder is a backend whose VMs need host programs besides those
// every VM needs (hostpkgs.Run): `agent-vm setup --backend NAME` installs
// them too (the vagrant backend: vagrant, vagrant-libvirt, libvirt).
type HostNeeder interface {
	HostNeeds() hostpkgs.Need
}

// GuestProgramLister is a backend whose guests have programs besides
// every guest's (sh, bash, git) that an MCP server may run: `agent-vm mcp
// sync` gives the guest only the servers whose command it has (the qemu
// backend's image: node, npm, python3 ...).
type GuestProgramLister interface {
	GuestPrograms() []string
}

// StartWarner is a backend with a warning about a VM's guest for its
// start, one that refuses nothing (the qemu backend: a guest set up
// before VMs' networks were contained); start logs it.
type StartWarner interface {
	// StartWarning is the warning for the VM whose record is r; "" for
	// none.
	StartWarning(r *state.Record) string
}

// ErrTemplateMismatch is a template (PrepareOptions.Template) that the
// VM cannot start from: the backend says why, and nothing was made.
var ErrTemplateMismatch = errors.New("the template does not fit this VM")

// Plan is how a backend wants its VM booted.
type Plan struct {
	// Boot is the plan of the driver the backend names (qemu.Boot for
	// "qemu"), which refuses any other.
	Boot driver.Boot
	// Credentials besides the MCP token (e.g. the NixOS guest's host key).
	Credentials []driver.Credential
	// FixedShare: the guest mounts exactly the share mode it was prepared
	// for, so the driver must not fall back from virtiofs to 9p.
	FixedShare bool
	// Settle is a shell command start runs in the guest (as its user, over
	// SSH) once the agent is healthy and before it returns: it waits for the
	// guest's own setup to finish and makes it durable, so a VM killed
	// right after start (SIGKILL, host crash) still boots. "" for none.
	Settle string
	// SetupLog is the guest's log of that setup, whose growth and last
	// line start shows while it waits for Settle; "" for none.
	SetupLog string
	// Setup is a root shell script start runs in the guest (over SSH) as
	// soon as it answers with its own key, before any session: it makes
	// the guest trust PrepareOptions.CACerts and gives it the
	// Placeholders, on every start, cold or not. "" for none.
	Setup string
	// Clone is set when the VM's disk was made now on a template's
	// (PrepareOptions.Template): the VM is to start from the template's
	// saved state (driver.Cloner), then become itself by these scripts.
	Clone *Clone
	// Adopt is set when the VM's disk is a copy of another VM's (a
	// fork's first start): its guest boots as that VM, then becomes
	// this one by a script run over SSH with that VM's keys.
	Adopt *Adopt
}

// Adopt is what makes a guest booted from a copy of another VM's disk
// this VM. Personalize holds secrets (the host key): never log it.
type Adopt struct {
	// Keys is a directory laid out as a VM's (state.Layout) with the
	// other VM's client key and host public key, the start's to remove
	// once used.
	Keys string
	// Personalize runs as root, logged in with those keys; afterwards
	// only the VM's own keys work.
	Personalize string
}

// Clone is what makes a guest restored from a template one VM, as root
// shell scripts run over SSH (see internal/cloudinit's clone.go). They
// hold secrets (the host key): never log them.
type Clone struct {
	// Personalize runs before the workspace is attached, logged in with
	// the template's key; afterwards only the VM's keys work.
	Personalize string
	// FirstRun runs once the workspace is mounted.
	FirstRun string
	// Quick: FirstRun installs nothing (the template has the agent CLI
	// and the packages) and the workspace has no provisioning script, so
	// it takes a moment and runs in the session that readies the guest,
	// with no wait that watches its progress.
	Quick bool
}

// Check is one thing doctor looked at.
type Check = driver.Check

// Readiness is a backend's part of doctor.
type Readiness struct {
	Ready  bool
	Checks []Check
}

// CreateFlags are the user's backend-specific choices at create. Each
// backend takes the ones it understands and refuses the others
// (CheckCreate), naming itself.
type CreateFlags struct {
	Image   string // --image: a base disk image (qemu)
	Config  string // --config: an extra NixOS module (nixos)
	Nixpkgs string // --nixpkgs: a nixpkgs path or flake reference (nixos)
	Agent   string // --agent: an agent CLI to install (guest.Agents)
	Box     string // --box: a Vagrant box (vagrant)
	// Vagrantfile is --vagrantfile (vagrant): auto, repo or generate.
	Vagrantfile string
	// Packages are the packages to install (--packages and the
	// repository's config.toml): each backend checks them against its own
	// naming grammar and names the first bad one.
	Packages []string
}

// StartFlags are the user's choices for one start. Each backend accepts the
// ones that mean something for its guests and refuses the others
// (CheckStart), so no flag is silently ignored.
type StartFlags struct {
	// Reprovision asks the guest's first-boot setup to run again.
	Reprovision bool
	// Nixpkgs builds the VM from this nixpkgs (a path or flake reference).
	Nixpkgs string
}

// PrepareOptions tell a backend what the driver will do.
type PrepareOptions struct {
	StartFlags
	Share  driver.ShareMode // the workspace share the driver will attach
	Report Reporter
	// CACerts are PEM CA certificates the guest is to trust besides its own
	// bundle: the host's added ones, unless the VM was created with
	// --no-host-ca; then the VM's own CA, with which its egress proxy
	// answers for the hosts its secrets are bound to (none for a
	// template: each of its clones trusts its own).
	CACerts []string
	// Placeholders are the environment variables every login, session
	// and command in the guest gets: each secret's name and its
	// placeholder (never a value).
	Placeholders map[string]string
	// GitCredentials are the git hosts whose token the VM's proxy holds,
	// each with that token's placeholder: the guest's git reaches them
	// over https (a remote in ssh form too) and answers the placeholder
	// when they ask for credentials.
	GitCredentials map[string]string
	// Template is the disk of a template (a saved machine) that a VM's
	// first disk is to be made on, for a VM that starts from it; "" for
	// none. A backend that has made the VM's disk before ignores it.
	Template string
	// TemplateAgents are the agent CLIs (guest.Agent names) the template's
	// guest has installed: a VM started from it does not install them
	// again.
	TemplateAgents []string
}

// Reporter receives progress while a long step runs: the phase, the time it
// has taken so far, and a detail (e.g. the guest's last console line).
type Reporter func(phase string, elapsed time.Duration, detail string)

// Report calls r if it is set.
func (r Reporter) Report(phase string, elapsed time.Duration, detail string) {
	if r != nil {
		r(phase, elapsed, detail)
	}
}
