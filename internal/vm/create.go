package vm

import (
	"context"
	"os"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/placement"
	"github.com/agent-vm/agent-vm/internal/size"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/modules"
)

// CreateOptions are create's inputs, already parsed.
type CreateOptions struct {
	Repo    string // a directory inside the source repository
	Branch  string // "" = the source's current branch
	From    string // start point for a new branch
	Backend string // auto, qemu, nixos, vagrant, libvirt
	// Host is a registered libvirt host to place the VM on (create
	// --host); "" is this machine, as the backend runs it.
	Host      string
	MCPPort   int    // 0 = allocate
	SSHPort   int    // 0 = allocate
	CPUs      int    // 0 = default
	MemoryMiB int    // 0 = default
	DiskGiB   int    // 0 = default
	Config    string // nixos: the user's extra NixOS module
	Nixpkgs   string // nixos: a nixpkgs path or flake reference
	Image     string // qemu: a base image path ("" = the built default)
	Box       string // vagrant: a Vagrant box ("" = agent-vm's own)
	// Vagrantfile is --vagrantfile (vagrant): auto, repo or generate.
	Vagrantfile string
	// AllowOrigins are browser origins agent-mcp accepts (e.g. https://claude.ai).
	AllowOrigins []string
	// Overcommit allows more memory than the host has, or more vCPUs than
	// its threads.
	Overcommit bool
	// NoHostCA keeps the host's added CA certificates out of the guest.
	NoHostCA bool
	// Net is the egress mode (egress.ModeOpen, ModeAllow, ModeOffline);
	// "" is ModeAllow.
	Net string
	// Agent is an agent CLI to install in the guest (guest.Agents).
	Agent string
	// Packages are packages to install in the guest at its first boot,
	// besides those of the repository's .agent-vm/config.toml.
	Packages []string
	// WorkspaceCache is how the guest caches the workspace
	// (driver.ShareCache*); "" is the default.
	WorkspaceCache string
	// IgnoreRepoPolicy leaves the repository's network policy file unread.
	IgnoreRepoPolicy bool
}

// ErrExists means a VM for that branch already exists (state.Root.Claim).
var ErrExists = state.ErrExists

// Create makes a new VM record with its keys, ports and workspace. It is
// atomic: everything is built in a staging directory and renamed into place
// at the end, so a failure or an interrupt leaves no VM directory behind.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (*state.Record, error) {
	source, err := m.Git.Toplevel(ctx, o.Repo)
	if err != nil {
		return nil, err
	}
	branch := o.Branch
	if branch == "" {
		if branch, err = m.Git.CurrentBranch(ctx, source); err != nil {
			return nil, err
		}
	}
	if err := m.Git.CheckBranchName(ctx, branch); err != nil {
		return nil, err
	}
	repo, err := m.Git.RepoID(ctx, source)
	if err != nil {
		return nil, err
	}
	if err := m.checkPlacement(&o); err != nil {
		return nil, err
	}
	be, err := m.resolveBackend(o.Backend)
	if err != nil {
		return nil, err
	}
	if err := checkCreateFlags(o, m.Size()); err != nil {
		return nil, err
	}
	if o.Net != "" {
		if err := egress.CheckMode(o.Net); err != nil {
			return nil, err
		}
	}
	if o.WorkspaceCache != "" {
		if err := driver.CheckShareCache(o.WorkspaceCache); err != nil {
			return nil, err
		}
	}
	flags := backend.CreateFlags{Image: o.Image, Box: o.Box, Vagrantfile: o.Vagrantfile, Config: o.Config, Nixpkgs: o.Nixpkgs, Agent: o.Agent, Packages: o.Packages}
	if err := be.CheckCreate(flags); err != nil {
		return nil, err
	}

	entries, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	slug, lock, err := m.Root.Claim(ctx, branch, repo, entries, func(e state.Entry) { m.migrateRepo(ctx, e) })
	if err != nil {
		return nil, err
	}
	defer lock.Release()

	staging, err := m.Root.BeginCreate(slug)
	if err != nil {
		return nil, err
	}
	committed := false
	var site *placement.Site // the VM's on its host, once its workspace is there
	defer func() {
		if !committed {
			if site != nil {
				site.Unplace(ctx)
			}
			staging.Abort()
		}
	}()
	rec := m.newRecord(o, branch, slug, be.Name())
	rec.Host = o.Host
	rec.Git.Source, rec.Git.Repo = source, repo
	l := staging.Layout
	if err := l.MakeDirs(); err != nil {
		return nil, err
	}
	if err := m.Book().Assign(ctx, o.MCPPort, o.SSHPort, rec, l); err != nil { // its SSH and MCP ports
		return nil, err
	}
	if err := state.WriteSecrets(l, rec); err != nil {
		return nil, err
	}
	if m.Contains(rec) && !m.templates {
		if _, _, err := egress.CAFiles(l.ProxyCA(), l.ProxyCAKey(), slug); err != nil {
			return nil, err
		}
	}
	log := m.Log.With("vm", slug)
	log.Info("cloning workspace", "source", source, "branch", branch)
	remotes, err := m.Git.Clone(ctx, gitws.CloneOptions{Source: source, Dest: l.Workspace(), Branch: branch, From: o.From})
	if err != nil {
		return nil, err
	}
	rec.Git.OriginURL, rec.Git.UpstreamURL = remotes.Origin, remotes.Upstream
	if rec.Guest.UID, rec.Guest.GID, err = gitws.Ownership(l.Workspace(), func() (int, int, error) { return m.Host.Account(ctx) }); err != nil {
		return nil, err
	}
	if err := m.applyRepoConfig(o, l, rec, be); err != nil {
		return nil, err
	}
	flags.Agent = rec.Agent
	// The backend may write files that name the VM's paths once created.
	rec.Paths = m.Root.Layout(slug).Paths()
	if err := be.Provision(ctx, l, rec, flags); err != nil {
		return nil, err
	}
	if err := m.checkForeignFlags(o, rec); err != nil {
		return nil, err
	}
	// A VM placed on another host has its workspace there, cloned onto
	// the host from the source; the local clone goes, so the agent's work
	// has one home.
	s, err := m.site(rec, m.machine(rec, l))
	if err != nil {
		return nil, err
	}
	if s != nil {
		if err := s.Place(ctx, rec.Git.Source, rec.Branch, o.From, rec.Guest.UID, rec.Guest.GID); err != nil {
			return nil, err
		}
		site = s
		if err := os.RemoveAll(l.Workspace()); err != nil {
			return nil, err
		}
	}
	if err := state.WriteRecord(l.Record(), rec); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, err := staging.Commit(); err != nil {
		return nil, err
	}
	committed = true
	log.Info("created", "backend", rec.Backend, "ssh_port", rec.Ports.SSH, "mcp_port", rec.Ports.MCP)
	return rec, nil
}

// checkCreateFlags checks what every backend shares, resources against the
// host that will run them; each backend checks its own flags
// (backend.CheckCreate).
func checkCreateFlags(o CreateOptions, host size.Host) error {
	if o.Agent != "" {
		if _, err := guest.LookupAgent(o.Agent); err != nil {
			return err
		}
	}
	for _, origin := range o.AllowOrigins {
		if err := modules.CheckOrigin("--allow-origin", origin); err != nil {
			return err
		}
	}
	return size.Check(o.CPUs, o.MemoryMiB, o.DiskGiB, host, o.Overcommit)
}

func (m *Manager) newRecord(o CreateOptions, branch, slug, backend string) *state.Record {
	r := &state.Record{
		Version: state.RecordVersion, ID: state.NewID(), Branch: branch, Slug: slug,
		MachineName: state.MachineName(slug), Backend: backend, CreatedAt: m.Now().UTC().Truncate(1e9),
		Resources: state.Resources{CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskGiB: o.DiskGiB},
		Guest:     state.Guest{User: guest.User, Proxy: true}, AllowOrigins: o.AllowOrigins, NoHostCA: o.NoHostCA, Agent: o.Agent,
		Packages: o.Packages, WorkspaceCache: o.WorkspaceCache,
	}
	if o.Net != "" && o.Net != egress.ModeAllow {
		r.Net = &state.Net{Mode: o.Net}
	}
	if r.Resources.CPUs == 0 {
		r.Resources.CPUs = size.DefaultCPUs()
	}
	if r.Resources.MemoryMiB == 0 {
		r.Resources.MemoryMiB = size.DefaultMemoryMiB
	}
	if r.Resources.DiskGiB == 0 {
		r.Resources.DiskGiB = size.DefaultDiskGiB
	}
	return r
}
