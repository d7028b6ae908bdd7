// Package placement is what agent-vm does for a VM placed on another host
// (create --host: its record's Host, a qemu+ssh libvirt host) beyond
// running it, which its driver does (driver.Placer): the VM's workspace
// lives there, not here, so the agent's work has one home. create clones
// the branch onto the host over agent-vm's own link (gitws.CloneOnHost);
// sync fetches from the host (gitws.SyncFromHost); destroy syncs the
// branch and inspects the workspace there before anything is removed; the
// repository's settings, the egress policy and the connection log cross
// the link. vm reaches all of it through a Site, which it makes for a
// placed VM only; the hosts themselves (the registry, `host doctor`, `host
// rm`) are hosts.go's.
package placement

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/repoconfig"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Site is one VM placed on another host: its machine (Mach.Remote is set)
// and the driver that runs it there.
type Site struct {
	Mach   driver.Machine
	Placer driver.Placer
	Git    *gitws.Git
	Log    hclog.Logger
	// Executable is agent-vm's own binary: git reaches the host through
	// it, and it is copied to the host to run the hidden verbs there.
	Executable func() (string, error)
}

// Host is the name of the site's host, as the registry knows it.
func (s *Site) Host() string { return s.Mach.Remote.Host }

// Paths are where the VM's files lie on its host.
func (s *Site) Paths() driver.HostPaths { return s.Placer.HostPaths(s.Mach) }

// Link is an open link to the site's host, and git's way there: the
// command git runs as its ssh (agent-vm's own binary).
type Link struct {
	C   *ssh.Client
	Git gitws.Host
}

// Close closes the link.
func (l *Link) Close() { l.C.Close() }

// errNoLink is the error for a VM whose host has no link here (its entry
// gone, or never linked).
func errNoLink(r *driver.Remote) error {
	return fmt.Errorf("host %s, which the VM is placed on, has no link set up here (hint: `agent-vm host list`; `agent-vm host link %s`)", r.Host, r.Host)
}

func (s *Site) target() hostlink.Target {
	r := s.Mach.Remote
	return hostlink.Target{Addr: r.Addr, User: r.User, KeyFile: r.KeyFile, KnownHosts: r.KnownHosts}
}

// Link opens the link to the site's host.
func (s *Site) Link(ctx context.Context) (*Link, error) {
	r := s.Mach.Remote
	if r.Addr == "" {
		return nil, errNoLink(r)
	}
	self, err := s.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding agent-vm's own binary, which git reaches host %s through: %w", r.Host, err)
	}
	c, err := hostlink.Dial(ctx, s.target())
	if err != nil {
		return nil, fmt.Errorf("reaching host %s: %w", r.Host, err)
	}
	return &Link{C: c, Git: gitws.Host{Name: r.Host, Run: hostlink.Runner{C: c}, SSH: hostlink.ExecArgv(self, s.target())}}, nil
}

// Place makes the VM's directory on its host and clones the branch there
// from source (at from, if set), owned by the guest user's ids uid:gid.
// On failure what it made on the host is removed.
func (s *Site) Place(ctx context.Context, source, branch, from string, uid, gid int) error {
	ws, err := s.Placer.PrepareHost(ctx, s.Mach)
	if err != nil {
		return err
	}
	link, err := s.Link(ctx)
	if err == nil {
		defer link.Close()
		s.Log.Info("cloning the workspace onto the host", "host", s.Host(), "path", ws)
		_, err = s.Git.CloneOnHost(ctx, link.Git, gitws.HostCloneOptions{
			CloneOptions: gitws.CloneOptions{Source: source, Dest: ws, Branch: branch, From: from},
			UID:          uid, GID: gid})
	}
	if err != nil {
		s.Unplace(ctx)
		return err
	}
	return nil
}

// Unplace removes what Place made on the host, after a create that failed
// here; a failure is logged, not returned (the create's own error is
// what the user needs).
func (s *Site) Unplace(ctx context.Context) {
	if err := s.Placer.RemoveFromHost(context.WithoutCancel(ctx), s.Mach); err != nil {
		s.Log.Warn("could not remove the VM's directory on its host after the failed create", "host", s.Host(), "error", err)
	}
}

// Sync fetches branch from the workspace on the host into source.
func (s *Site) Sync(ctx context.Context, source, branch string) (*gitws.SyncResult, error) {
	l, err := s.Link(ctx)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	return s.Git.SyncFromHost(ctx, l.Git, s.Paths().Workspace, source, branch)
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

// Unsaved is destroy's check of the workspace on the host: the branch
// fetched into source first (Sync), then the workspace inspected on the
// host by agent-vm's binary there; commits source now has count as saved.
// slug names the VM in the hints.
func (s *Site) Unsaved(ctx context.Context, source, branch, slug string) (gitws.Unsaved, error) {
	hint := fmt.Sprintf("fix what stops the check and destroy again; `agent-vm destroy %s --force` destroys the VM without it, losing whatever is only there", slug)
	if _, err := s.Sync(ctx, source, branch); err != nil {
		return gitws.Unsaved{}, fmt.Errorf("saving VM %q's branch from host %s before destroying it: %w (hint: %s)", branch, s.Host(), err, hint)
	}
	out, err := s.OnHost(ctx, WorkspaceCheckCommand, "--workspace", s.Paths().Workspace)
	if err != nil {
		// git's errors quote the workspace: escaped.
		return gitws.Unsaved{}, fmt.Errorf("checking the workspace on host %s for unsaved work: %s (hint: %s)", s.Host(), termsafe.String(err.Error()), hint)
	}
	var u gitws.Unsaved
	if err := json.Unmarshal(out, &u); err != nil {
		return gitws.Unsaved{}, fmt.Errorf("checking the workspace on host %s for unsaved work: its answer is not JSON: %v (hint: %s)", s.Host(), err, hint)
	}
	s.Git.DropSaved(ctx, &u, source)
	return u, nil
}

// OnHost runs a verb of agent-vm's binary on the site's host (copied there
// first if it is not) and returns its standard output.
func (s *Site) OnHost(ctx context.Context, verb string, args ...string) ([]byte, error) {
	r := s.Mach.Remote
	if r.Addr == "" {
		return nil, errNoLink(r)
	}
	self, err := s.Executable()
	if err != nil {
		return nil, err
	}
	c, agent, err := hostlink.DialAgent(ctx, s.target(), self, r.Dir, func(err error) {
		s.Log.Warn("could not prune older copies of agent-vm's binary on the host", "host", r.Host, "error", err)
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

// RepoConfig is the repository's settings as the workspace on the host
// now says, read there by agent-vm's binary and parsed here.
func (s *Site) RepoConfig(ctx context.Context) (*repoconfig.Config, error) {
	ws := s.Paths().Workspace
	name := ws + "/" + guest.ConfigFile + " on host " + s.Host()
	out, err := s.OnHost(ctx, WorkspaceConfigCommand, "--workspace", ws)
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

// PutPolicy writes the VM's egress policy into its proxy's directory on
// the host, atomically, readable only by uid:gid (the proxy's user; 0:
// root), which the proxy there re-reads as it changes.
func (s *Site) PutPolicy(ctx context.Context, data []byte, uid, gid int) error {
	l, err := s.Link(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	owner := ""
	if uid > 0 {
		owner = strconv.Itoa(uid) + ":" + strconv.Itoa(gid)
	}
	const put = `umask 077; cat > "$1.tmp" && { [ -z "$2" ] || chown "$2" "$1.tmp"; } && mv -f "$1.tmp" "$1"`
	dst := path.Join(s.Paths().NetDir, egress.PolicyFile)
	if _, err := l.Git.Run.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", put, "sh", dst, owner}, Stdin: bytes.NewReader(data)}); err != nil {
		return fmt.Errorf("copying the policy to host %s: %w", s.Host(), err)
	}
	return nil
}

// PullLog copies the VM's connection log, its proxy's log on the host,
// over local (which nothing else writes), and with follow appends what the
// host's log gains (tail -F there) until the returned stop is called.
func (s *Site) PullLog(ctx context.Context, local string, follow bool) (stop func(), err error) {
	src := path.Join(s.Paths().NetDir, egress.LogFile)
	l, err := s.Link(ctx)
	if err != nil {
		return nil, err
	}
	if !follow {
		defer l.Close()
		res, err := l.Git.Run.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", `[ ! -e "$1" ] || cat -- "$1"`, "sh", src}})
		if err != nil {
			return nil, fmt.Errorf("reading the connection log on host %s: %w", s.Host(), err)
		}
		if err := atomicfile.Write(local, res.Stdout, 0o600); err != nil {
			return nil, err
		}
		return func() {}, nil
	}
	var off int64
	if fi, err := os.Stat(local); err == nil {
		off = fi.Size()
	}
	f, err := os.OpenFile(local, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		l.Close()
		return nil, err
	}
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = sshx.Run(fctx, l.C, sshx.Quote([]string{"tail", "-c", "+" + strconv.FormatInt(off+1, 10), "-F", "--", src}), nil, f, io.Discard)
	}()
	return func() {
		cancel()
		l.Close()
		<-done
		f.Close()
	}, nil
}

// Run runs the shell command cmd on the site's host over the link, its
// output to w (logs' console on the host).
func (s *Site) Run(ctx context.Context, cmd string, w io.Writer) error {
	l, err := s.Link(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	_, err = sshx.Run(ctx, l.C, cmd, nil, w, w)
	return err
}
