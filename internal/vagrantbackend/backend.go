// Package vagrantbackend is the backend users call "vagrant": the Debian
// guest of the qemu backend, made an agent-vm guest by the same cloud-init
// seed (internal/seed), booted from a Vagrant box by the vagrant driver
// (internal/vagrant, whose package doc has the design): agent-vm's own box
// (internal/vagrantbox, made from the base image) or one of --box; or the
// repository's own Vagrantfile, run as is. It owns its section of the VM
// record (Settings). What it shares with the qemu backend (internal/debian)
// is the seed, in a package of its own: neither backend imports the other.
package vagrantbackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/cloudinit"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/seed"
	"github.com/agent-vm/agent-vm/internal/sshconfig"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vagrant"
	"github.com/agent-vm/agent-vm/internal/vagrantbox"
)

// Name is the vagrant backend's name in VM records: the same Debian guest
// and cloud-init seed as the qemu backend, run by vagrant (vagrant-libvirt)
// from a box (see internal/vagrant's package doc).
const Name = "vagrant"

// Backend is the Debian guest run by the Vagrant driver.
type Backend struct {
	Run execx.Runner
	Log hclog.Logger
	// Executable is the agent-vm binary the guest runs as its MCP proxy.
	Executable func() (string, error)
	// ImageDir holds the base images agent-vm's own box is made from.
	ImageDir string
	// Home is the vagrant driver's VAGRANT_HOME, where the box is added
	// (hostdir.Table.VagrantHome).
	Home *hostdir.Dir
	// Progress receives vagrant's output while the box is added.
	Progress io.Writer
}

var (
	_ backend.Backend    = (*Backend)(nil)
	_ backend.Foreigner  = (*Backend)(nil)
	_ backend.HostNeeder = (*Backend)(nil)
)

// Settings is this backend's section of the VM record.
type Settings struct {
	// Box is the Vagrant box of --box; "" (or vagrant.DefaultBox, in
	// records of earlier VMs) is agent-vm's own, made from its base image.
	Box string `json:"box,omitempty"`
	// Provision counts re-provisioning requests (start --reprovision), as
	// the qemu backend's does: a new instance-id for the seed.
	Provision int `json:"provision"`
	// Vagrantfile is the repository's own Vagrantfile the VM runs as is
	// (create --vagrantfile auto or repo), "" for agent-vm's generated
	// one; Machine is the one machine it defines.
	Vagrantfile string `json:"vagrantfile,omitempty"`
	Machine     string `json:"machine,omitempty"`
	// Contained: the machine was made (at create or reset) for its
	// contained network: its NIC on the VM's own libvirt network, its
	// guest using the egress proxy. Machines of agent-vm's own Vagrantfile
	// made before the vagrant backend contained networks lack both and are
	// not started until a reset (CheckStart).
	Contained bool `json:"contained,omitempty"`
}

// --vagrantfile's values.
const (
	// VagrantfileAuto (or ""): the repository's Vagrantfile when it has
	// one at its root, else agent-vm's.
	VagrantfileAuto = "auto"
	// VagrantfileRepo: the repository's, which must be there.
	VagrantfileRepo = "repo"
	// VagrantfileGenerate: agent-vm's own, whatever the repository has.
	VagrantfileGenerate = "generate"
)

// Name implements backend.Backend.
func (b *Backend) Name() string { return Name }

// Driver is "vagrant".
func (b *Backend) Driver() string { return vagrant.DriverName }

// HostNeeds implements backend.HostNeeder: the vagrant driver's programs
// (vagrant, vagrant-libvirt, libvirt).
func (b *Backend) HostNeeds() hostpkgs.Need { return hostpkgs.Vagrant }

// Doctor implements backend.Backend: the driver checks vagrant, its
// plugin and libvirt; the box is added on the first `vagrant up`.
func (b *Backend) Doctor(context.Context) backend.Readiness {
	return backend.Readiness{Ready: true}
}

// CheckCreate implements backend.Backend.
func (b *Backend) CheckCreate(f backend.CreateFlags) error {
	switch {
	case f.Image != "":
		return fmt.Errorf("--image sets the base disk image of the qemu backend; the vagrant backend boots a box (hint: use --box NAME, or pass --backend qemu)")
	case f.Config != "" || f.Nixpkgs != "":
		return fmt.Errorf("--config and --nixpkgs belong to the nixos backend; the vagrant backend boots a Debian box (hint: drop them, or pass --backend nixos)")
	}
	if f.Box != "" {
		if err := vagrant.CheckBoxName(f.Box); err != nil {
			return err
		}
	}
	switch f.Vagrantfile {
	case "", VagrantfileAuto, VagrantfileRepo, VagrantfileGenerate:
	default:
		return fmt.Errorf("--vagrantfile %q: must be auto (the repository's Vagrantfile when it has one, else agent-vm's), repo or generate (hint: --vagrantfile=generate uses agent-vm's own)", f.Vagrantfile)
	}
	return cloudinit.CheckPackages(f.Packages)
}

// Provision implements backend.Backend. With the repository's own
// Vagrantfile (userProject) it records that file and its machine, and
// nothing else; else it records the box and writes agent-vm's Vagrantfile
// into the VM's run directory (never into the workspace), with the paths
// the VM will have once created (r.Paths.Dir) and KVM; every start writes
// it again for its accelerator and share.
func (b *Backend) Provision(ctx context.Context, l state.Layout, r *state.Record, f backend.CreateFlags) error {
	final := state.Layout{Dir: r.Paths.Dir}
	if final.Dir == "" {
		return fmt.Errorf("internal error: the VM's final directory is not known at provisioning")
	}
	u, err := b.userProject(ctx, l, r, f)
	if err != nil {
		return err
	}
	if u != nil {
		if err := r.SetSection(Settings{Vagrantfile: u.Vagrantfile, Machine: u.Machine}); err != nil {
			return err
		}
		r.Guest.Foreign = u.Vagrantfile
		name := vagrant.UniqueName(r.MachineName, r.ID)
		if err := vagrant.LinkUserRoot(l.RunDir(), name, final.Workspace()); err != nil {
			return err
		}
		u.Dir = vagrant.UserRoot(final.RunDir(), name)
		return vagrant.WriteUser(l.RunDir(), *u)
	}
	s := Settings{Box: f.Box, Contained: true}
	if err := r.SetSection(s); err != nil {
		return err
	}
	boot := b.boot(final, r, s)
	if ownBox(s) {
		// The box as the next start will add it, when the image is there.
		boot.Box = "agent-vm/" + image.DefaultBuildName
		if img, err := image.Lookup(b.ImageDir, image.DefaultBuildName); err == nil {
			if box, err := vagrantbox.For(img); err == nil {
				boot.Box, boot.BoxVersion, boot.Guest, boot.Cmdline = box.Name, box.Version, vagrantGuest, box.Cmdline
			}
		}
	}
	v := vagrant.SpecOf(backend.MachineOf(r, final), boot, driver.StartOptions{Accel: "kvm", Share: driver.ShareVirtiofs}, vagrant.DefaultURI)
	return vagrant.Write(l.RunDir(), v)
}

// userProject decides, per --vagrantfile, whether the VM runs the
// repository's own Vagrantfile (nil: agent-vm's). It asks vagrant, with
// the VM's own machine state, which machines the file defines, and
// refuses several, and the flags that do not apply to it.
func (b *Backend) userProject(ctx context.Context, l state.Layout, r *state.Record, f backend.CreateFlags) (*vagrant.UserProject, error) {
	if f.Vagrantfile == VagrantfileGenerate {
		return nil, nil
	}
	path, ok, err := vagrant.FindUserVagrantfile(r.Git.Source)
	switch {
	case err != nil:
		return nil, err
	case !ok && f.Vagrantfile == VagrantfileRepo:
		return nil, fmt.Errorf("--vagrantfile=repo: the repository %s has no Vagrantfile at its root (hint: drop --vagrantfile to use agent-vm's own)", r.Git.Source)
	case !ok:
		return nil, nil
	}
	why := " does not apply to the repository's Vagrantfile " + path + ", which agent-vm runs as is (hint: drop it, or pass --vagrantfile=generate to use agent-vm's own Vagrantfile)"
	switch {
	case f.Box != "":
		return nil, fmt.Errorf("--box%s", why)
	case f.Agent != "":
		return nil, fmt.Errorf("--agent (or the repository's .agent-vm/config.toml agent)%s", why)
	case len(f.Packages) > 0:
		return nil, fmt.Errorf("--packages (or the packages of the repository's .agent-vm/config.toml)%s", why)
	}
	u := vagrant.UserProject{Vagrantfile: path, Dir: l.Workspace()}
	names, err := vagrant.UserMachines(ctx, b.Run, u, filepath.Join(vagrant.Project(l.RunDir()), vagrant.DotDir), b.home())
	if err != nil {
		return nil, err
	}
	if u.Machine, err = vagrant.OneMachine(path, names); err != nil {
		return nil, err
	}
	return &u, nil
}

// boot is the plan: the box, the seed, the NIC's MAC, the SSH login.
func (b *Backend) boot(l state.Layout, r *state.Record, s Settings) vagrant.Boot {
	return vagrant.Boot{Box: s.Box, Seed: filepath.Join(l.Dir, seed.File), MAC: seed.MACOf(r.ID), SSHUser: r.Guest.User, SSHKey: l.ClientKey()}
}

// Reset implements backend.Backend. The root disk is the libvirt
// domain's, which the driver's Destroy (vm.Reset) removed with the
// domain; the next start's `vagrant up` makes both afresh from the box,
// and cloud-init provisions the new disk (the seed is written at every
// start), for the contained network.
func (b *Backend) Reset(_ context.Context, _ state.Layout, r *state.Record) error {
	var s Settings
	if err := r.Section(&s); err != nil {
		return err
	}
	if s.Vagrantfile != "" {
		return nil
	}
	s.Contained = true
	return r.SetSection(s)
}

// CheckStart implements backend.Backend. A VM of agent-vm's own
// Vagrantfile made before the vagrant backend contained networks is
// refused until a reset: its libvirt domain's NIC is on vagrant-libvirt's
// NAT network (vagrant up starts an existing domain as it was defined, so
// the start's own network would not be the one it uses) and its guest was
// set up without the egress proxy.
func (b *Backend) CheckStart(r *state.Record, f backend.StartFlags) error {
	if f.Nixpkgs != "" {
		return fmt.Errorf("--nixpkgs chooses the nixpkgs a nixos VM is built from; VM %q uses the vagrant backend (hint: drop --nixpkgs)", r.Branch)
	}
	var s Settings
	if err := r.Section(&s); err != nil {
		return err
	}
	if s.Vagrantfile == "" && !s.Contained {
		return fmt.Errorf("VM %q was made by an older agent-vm, before the vagrant backend contained VMs' networks: its machine is on vagrant-libvirt's NAT network and its guest knows no egress proxy, so it is not started as it is (hint: `agent-vm reset %s` makes its machine afresh, contained; the workspace, ports and network policy are kept, what was installed in the guest is not)", r.Branch, r.Slug)
	}
	return nil
}

// Prepare implements backend.Backend: a fresh seed, and the plan.
func (b *Backend) Prepare(ctx context.Context, l state.Layout, r *state.Record, o backend.PrepareOptions) (*backend.Plan, error) {
	s, err := seed.ForStart(r, o.Reprovision, func(s *Settings) *int { return &s.Provision })
	if err != nil {
		return nil, err
	}
	if s.Vagrantfile != "" {
		return b.prepareUser(r, l, s, o)
	}
	c, err := seed.Config(l, r, s.Provision, o.CACerts)
	if err != nil {
		return nil, err
	}
	c.MACAddress = seed.MACOf(r.ID)
	if err := seed.Write(ctx, l, r, c, b.Executable); err != nil {
		return nil, err
	}
	boot := b.boot(l, r, s)
	if ownBox(s) {
		box, err := b.addBox(ctx, o.Report)
		if err != nil {
			return nil, err
		}
		boot.Box, boot.BoxVersion, boot.Guest, boot.Cmdline = box.Name, box.Version, vagrantGuest, box.Cmdline
	}
	setup, err := cloudinit.Setup(cloudinit.SetupConfig{CACerts: o.CACerts, Placeholders: o.Placeholders, GitCredentials: o.GitCredentials})
	if err != nil {
		return nil, err
	}
	return &backend.Plan{Boot: boot, Settle: cloudinit.SettleCommand, SetupLog: guest.FirstBootLog, Setup: setup}, nil
}

// prepareUser is Prepare for the repository's own Vagrantfile: it checks
// the file again (it may have gone, or become a directory or a symlink out
// of the repository, since create) and plans nothing else; the guest is
// the Vagrantfile's, so there is no seed and nothing to settle.
func (b *Backend) prepareUser(r *state.Record, l state.Layout, s Settings, o backend.PrepareOptions) (*backend.Plan, error) {
	if o.Reprovision {
		return nil, fmt.Errorf("--reprovision reruns agent-vm's guest setup, and VM %q runs the repository's own Vagrantfile (hint: run its provisioners with `vagrant provision`, using the environment in %s)", r.Branch, filepath.Join(vagrant.Project(l.RunDir()), vagrant.UserFile))
	}
	path, ok, err := vagrant.FindUserVagrantfile(r.Git.Source)
	if err == nil && !ok {
		err = fmt.Errorf("VM %q runs the repository's Vagrantfile %s, which is gone (hint: restore it, or destroy the VM and create it again with --vagrantfile=generate)", r.Branch, s.Vagrantfile)
	}
	if err != nil {
		return nil, err
	}
	name := vagrant.UniqueName(r.MachineName, r.ID)
	if err := vagrant.LinkUserRoot(l.RunDir(), name, l.Workspace()); err != nil {
		return nil, err
	}
	u := vagrant.UserProject{Vagrantfile: path, Dir: vagrant.UserRoot(l.RunDir(), name), Machine: s.Machine}
	return &backend.Plan{Boot: vagrant.Boot{User: &u}}, nil
}

// ownBox: the VM boots agent-vm's own box, not one of --box.
// vagrantGuest is what agent-vm's own box runs, in vagrant's guest names:
// said in the Vagrantfile, so vagrant does not detect it at every up.
const vagrantGuest = "debian"

func ownBox(s Settings) bool { return s.Box == "" || s.Box == vagrant.DefaultBox }

// addBox adds agent-vm's own box, made from the default base image, to
// the driver's VAGRANT_HOME unless it is there, and checks that libvirt's
// QEMU can read the kernel it boots from there.
func (b *Backend) addBox(ctx context.Context, report backend.Reporter) (vagrantbox.Box, error) {
	img, err := image.Lookup(b.ImageDir, image.DefaultBuildName)
	if errors.Is(err, image.ErrNotFound) {
		return vagrantbox.Box{}, fmt.Errorf("there is no base image in %s to make the vagrant box from (hint: build it with `sudo agent-vm image build` (about 2 minutes), or create the VM with --box NAME)", b.ImageDir)
	}
	if err != nil {
		return vagrantbox.Box{}, err
	}
	box, err := vagrantbox.For(img)
	if err != nil {
		return vagrantbox.Box{}, err
	}
	if b.Home == nil {
		return vagrantbox.Box{}, errors.New("internal error: no VAGRANT_HOME")
	}
	if err := b.Home.Make(); err != nil {
		return vagrantbox.Box{}, fmt.Errorf("making VAGRANT_HOME: %w", err)
	}
	home := b.Home.Path
	if _, err := os.Stat(filepath.Join(box.Dir(home), vagrantbox.MetadataFile)); err != nil {
		report.Report("adding the vagrant box "+box.String()+" (first start with this image, about a minute)", 0, "")
	}
	if box, err = vagrantbox.Add(ctx, img, vagrantbox.AddOptions{Run: b.Run, Home: home, WorkDir: filepath.Dir(home), Progress: b.Progress}); err != nil {
		return vagrantbox.Box{}, err
	}
	if err := vagrantbox.CheckQEMUCanRead(filepath.Join(box.Dir(home), image.KernelFile)); err != nil {
		return vagrantbox.Box{}, fmt.Errorf("%w (VAGRANT_HOME is %s: set AGENT_VM_VAGRANT_HOME to a directory outside home directories, e.g. /var/lib/agent-vm/vagrant)", err, home)
	}
	return box, nil
}

// home is VAGRANT_HOME's path; "" (vagrant's default) when unset.
func (b *Backend) home() string {
	if b.Home == nil {
		return ""
	}
	return b.Home.Path
}

// Release implements backend.Backend: nothing outside the directory.
func (b *Backend) Release(state.Layout) error { return nil }

// ImagesInUse implements backend.Backend: boxes are vagrant's.
func (b *Backend) ImagesInUse(state.Layout) []string { return nil }

// foreignLacks is what a VM of the repository's own Vagrantfile does not
// get, for create to tell the user (one line each).
var foreignLacks = []string{
	"agent-mcp: the guest runs no agent-mcp, so there is no MCP endpoint nor `agent-vm mcp-config`",
	"a pinned host key: agent-vm reaches the guest with `vagrant ssh-config` (vagrant's own key, host key not checked), not its own keys",
	"port choice: the forwards are whatever the Vagrantfile says (create's --port and `agent-vm port` do not apply)",
	"the workspace share: the Vagrantfile's synced folders decide what the guest sees (its \".\" is this VM's workspace, the branch's clone)",
	"network containment: `agent-vm net` and `port expose` refuse the VM (as for every vagrant VM)",
	"agent-vm's provisioning: no user dev, agent CLI, packages or .agent-vm/provision.sh; the Vagrantfile's provisioners run instead",
}

// Foreign implements backend.Foreigner: a VM made from the repository's
// own Vagrantfile (the record's Guest.Foreign, which Provision sets) runs
// it as is.
func (b *Backend) Foreign(r *state.Record) (backend.Foreign, bool) {
	if r.Guest.Foreign == "" {
		return backend.Foreign{}, false
	}
	return backend.Foreign{
		Config: r.Guest.Foreign,
		Lacks:  foreignLacks,
		Reach:  fmt.Sprintf("`agent-vm ssh-config %s >> ~/.ssh/config` and `ssh %s` reach it with vagrant's key", r.Slug, sshconfig.Alias(r.Slug)),
		Own:    "destroy it and create it with --vagrantfile=generate (agent-vm's own Vagrantfile)",
		NoKVM:  "KVM is not usable here: for the libvirt provider the repository's Vagrantfile must set libvirt.driver = \"qemu\" (TCG, software emulation), else vagrant up fails",
	}, true
}
