package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/repoconfig"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"golang.org/x/crypto/ssh"
)

// A VM placed on another host (its record's Host, a qemu+ssh host) has its
// workspace there, not here: create clones the branch onto the host over
// agent-vm's link (gitws.CloneOnHost) and removes its local clone, so the
// agent's work has one home; sync fetches from the host
// (gitws.SyncFromHost); destroy syncs the branch before removing anything.

// placerOf is the driver of the VM whose record is r, which places it on
// another host.
func (m *Manager) placerOf(r *state.Record) (driver.Placer, error) {
	d, err := m.driverOf(r)
	if err != nil {
		return nil, err
	}
	p, ok := d.(driver.Placer)
	if !ok {
		return nil, fmt.Errorf("internal error: the %s driver places no VM on another host", d.Name())
	}
	return p, nil
}

// hostPaths are where the files of mach, placed on another host, lie there.
func (m *Manager) hostPaths(r *state.Record, mach driver.Machine) (driver.HostPaths, error) {
	p, err := m.placerOf(r)
	if err != nil {
		return driver.HostPaths{}, err
	}
	return p.HostPaths(mach), nil
}

// placedLink is an open link to the host a VM is placed on, and git's way
// there: the command git runs as its ssh (agent-vm's own binary here).
type placedLink struct {
	c   *ssh.Client
	git gitws.Host
}

func (l *placedLink) Close() { l.c.Close() }

// errNoLink is the error for a VM whose host has no link here (its entry
// gone, or never linked).
func errNoLink(r *driver.Remote) error {
	return fmt.Errorf("host %s, which the VM is placed on, has no link set up here (hint: `agent-vm host list`; `agent-vm host link %s`)", r.Host, r.Host)
}

// linkFor opens the link to the host mach is placed on.
func (m *Manager) linkFor(ctx context.Context, mach driver.Machine) (*placedLink, error) {
	r := mach.Remote
	if r.Addr == "" {
		return nil, errNoLink(r)
	}
	t := hostlink.Target{Addr: r.Addr, User: r.User, KeyFile: r.KeyFile, KnownHosts: r.KnownHosts}
	self, err := m.executable()
	if err != nil {
		return nil, fmt.Errorf("finding agent-vm's own binary, which git reaches host %s through: %w", r.Host, err)
	}
	c, err := hostlink.Dial(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("reaching host %s: %w", r.Host, err)
	}
	return &placedLink{c: c, git: gitws.Host{Name: r.Host, Run: hostlink.Runner{C: c}, SSH: hostlink.ExecArgv(self, t)}}, nil
}

// placeWorkspace clones the new VM's branch onto its host, owned there by
// the guest user's ids, and removes the local clone create made. On
// failure what it made on the host is removed.
func (m *Manager) placeWorkspace(ctx context.Context, rec *state.Record, l state.Layout, o CreateOptions) error {
	mach := m.machine(rec, l)
	if mach.Remote == nil {
		return nil
	}
	d, err := m.placerOf(rec)
	if err != nil {
		return err
	}
	ws, err := d.PrepareHost(ctx, mach)
	if err != nil {
		return err
	}
	link, err := m.linkFor(ctx, mach)
	if err == nil {
		defer link.Close()
		m.Log.Info("cloning the workspace onto the host", "host", mach.Remote.Host, "path", ws)
		_, err = m.Git.CloneOnHost(ctx, link.git, gitws.HostCloneOptions{
			CloneOptions: gitws.CloneOptions{Source: rec.Git.Source, Dest: ws, Branch: rec.Branch, From: o.From},
			UID:          rec.Guest.UID, GID: rec.Guest.GID})
	}
	if err != nil {
		m.unplace(ctx, rec, l)
		return err
	}
	return os.RemoveAll(l.Workspace())
}

// syncPlaced is Sync for a VM placed on a host.
func (m *Manager) syncPlaced(ctx context.Context, e state.Entry, mach driver.Machine) (*SyncResult, error) {
	l, err := m.linkFor(ctx, mach)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	hp, err := m.hostPaths(e.Record, mach)
	if err != nil {
		return nil, err
	}
	return m.Git.SyncFromHost(ctx, l.git, hp.Workspace, e.Record.Git.Source, e.Record.Branch)
}

// WorkspaceCheckCommand is the hidden verb of agent-vm's binary that, on a
// VM's host, inspects the workspace there for unsaved work
// (CheckWorkspace).
const WorkspaceCheckCommand = "__workspace-check"

// CheckWorkspace is WorkspaceCheckCommand: gitws.Inspect of the workspace
// ws on this machine, with no source repository (it is on the machine that
// asks), written to out as JSON.
func CheckWorkspace(ctx context.Context, ws string, out io.Writer) error {
	u, err := gitws.New(execx.OS{}).Inspect(ctx, ws, "")
	if err != nil {
		return err
	}
	return json.NewEncoder(out).Encode(u)
}

// checkUnsavedPlaced is destroy's check of a VM placed on a host: its
// branch fetched here first (sync), then the workspace inspected on the
// host by agent-vm's binary there; commits the source now has count as
// saved.
func (m *Manager) checkUnsavedPlaced(ctx context.Context, e state.Entry, mach driver.Machine) error {
	hint := fmt.Sprintf("fix what stops the check and destroy again; `agent-vm destroy %s --force` destroys the VM without it, losing whatever is only there", e.Slug)
	if _, err := m.syncPlaced(ctx, e, mach); err != nil {
		return fmt.Errorf("saving VM %q's branch from host %s before destroying it: %w (hint: %s)", e.Record.Branch, mach.Remote.Host, err, hint)
	}
	hp, err := m.hostPaths(e.Record, mach)
	if err != nil {
		return err
	}
	ws := hp.Workspace
	out, err := m.onHost(ctx, mach, WorkspaceCheckCommand, "--workspace", ws)
	if err != nil {
		// git's errors quote the workspace: escaped.
		return fmt.Errorf("checking the workspace on host %s for unsaved work: %s (hint: %s)", mach.Remote.Host, termsafe.String(err.Error()), hint)
	}
	var u gitws.Unsaved
	if err := json.Unmarshal(out, &u); err != nil {
		return fmt.Errorf("checking the workspace on host %s for unsaved work: its answer is not JSON: %v (hint: %s)", mach.Remote.Host, err, hint)
	}
	m.Git.DropSaved(ctx, &u, e.Record.Git.Source)
	if u.Empty() {
		return nil
	}
	return &UnsavedError{Report: u.Report(ws, e.Record.Branch, e.Slug) + fmt.Sprintf("\n(the workspace is %s on host %s)", ws, mach.Remote.Host)}
}

// unplace removes what create made on the host of a VM it then failed to
// make here.
func (m *Manager) unplace(ctx context.Context, rec *state.Record, l state.Layout) {
	mach := m.machine(rec, l)
	d, err := m.placerOf(rec)
	if err == nil && mach.Remote != nil {
		err = d.RemoveFromHost(context.WithoutCancel(ctx), mach)
	}
	if err != nil {
		m.Log.Warn("could not remove the VM's directory on its host after the failed create", "host", rec.Host, "error", err)
	}
}

// WorkspacePath is where the workspace of the VM whose record is r lies:
// its path on the VM's host when it is placed on another machine (host
// names it), else here.
func (m *Manager) WorkspacePath(r *state.Record, l state.Layout) (path, host string) {
	if mach := m.machine(r, l); mach.Remote != nil {
		if hp, err := m.hostPaths(r, mach); err == nil {
			return hp.Workspace, mach.Remote.Host
		}
		return "", mach.Remote.Host
	}
	return l.Workspace(), ""
}

// onHost runs a verb of agent-vm's binary on mach's host (copied there
// first if it is not) and returns its standard output.
func (m *Manager) onHost(ctx context.Context, mach driver.Machine, verb string, args ...string) ([]byte, error) {
	r := mach.Remote
	if r.Addr == "" {
		return nil, errNoLink(r)
	}
	self, err := m.executable()
	if err != nil {
		return nil, err
	}
	t := hostlink.Target{Addr: r.Addr, User: r.User, KeyFile: r.KeyFile, KnownHosts: r.KnownHosts}
	c, agent, err := hostlink.DialAgent(ctx, t, self, r.Dir, func(err error) {
		m.Log.Warn("could not prune older copies of agent-vm's binary on the host", "host", r.Host, "error", err)
	})
	if err != nil {
		return nil, fmt.Errorf("reaching host %s: %w", r.Host, err)
	}
	defer c.Close()
	res, err := hostlink.Runner{C: c}.Run(ctx, execx.Cmd{Path: agent, Args: append([]string{verb}, args...)})
	if err != nil {
		return nil, err
	}
	return res.Stdout, nil
}

// WorkspaceConfigCommand is the hidden verb of agent-vm's binary that, on
// a VM's host, reads the repository's settings from the workspace there
// (ReadWorkspaceConfig).
const WorkspaceConfigCommand = "__workspace-config"

// workspaceConfig is WorkspaceConfigCommand's answer.
type workspaceConfig struct {
	Found bool   `json:"found"`
	Data  []byte `json:"data,omitempty"`
}

// ReadWorkspaceConfig is WorkspaceConfigCommand: the workspace ws's
// settings file on this machine, read as repoconfig reads it (no link in
// the workspace followed, its size bounded), written to out as JSON.
func ReadWorkspaceConfig(ws string, out io.Writer) error {
	raw, found, err := repoconfig.Raw(ws, "")
	if err != nil {
		return err
	}
	return json.NewEncoder(out).Encode(workspaceConfig{Found: found, Data: raw})
}

// repoConfig is the repository's settings as the VM's workspace now says:
// read here, or, for a VM placed on another host, read there by agent-vm's
// binary and parsed here.
func (m *Manager) repoConfig(ctx context.Context, r *state.Record, l state.Layout) (*repoconfig.Config, error) {
	mach := m.machine(r, l)
	if mach.Remote == nil {
		return repoconfig.Load(l.Workspace(), "")
	}
	hp, err := m.hostPaths(r, mach)
	if err != nil {
		return nil, err
	}
	ws := hp.Workspace
	name := ws + "/" + guest.ConfigFile + " on host " + mach.Remote.Host
	out, err := m.onHost(ctx, mach, WorkspaceConfigCommand, "--workspace", ws)
	if err != nil {
		return nil, fmt.Errorf("reading the repository's agent-vm settings %s: %s", name, termsafe.String(err.Error()))
	}
	var wc workspaceConfig
	if err := json.Unmarshal(out, &wc); err != nil {
		return nil, fmt.Errorf("reading the repository's agent-vm settings %s: the host's answer is not JSON: %v", name, err)
	}
	if !wc.Found {
		return &repoconfig.Config{}, nil
	}
	return repoconfig.Parse(name, wc.Data)
}
