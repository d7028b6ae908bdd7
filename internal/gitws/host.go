package gitws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Host is a remote host a workspace lives on, as this package reaches it:
// Run runs programs there (hostlink.Runner over agent-vm's link), and SSH
// is the command git runs as its ssh to reach it (hostlink's shim, the argv
// hostlink.ExecArgv makes): git appends a host name, which the shim
// ignores, and the command line to run there. What runs on the host is
// git hardened as in a local workspace, plus sh, mkdir, rm and chown.
type Host struct {
	Name string // for messages
	Run  execx.Runner
	SSH  []string
}

func (h Host) String() string {
	if h.Name == "" {
		return "the host"
	}
	return "host " + h.Name
}

// HostCloneOptions says what to clone where on a host, and who owns it
// there.
type HostCloneOptions struct {
	// Source, Branch and From are Clone's. Dest is an absolute path on the
	// host that must not exist; its parent must.
	CloneOptions
	// UID and GID own the workspace's files on the host when it is made
	// (the guest user's ids): the login user there must be root, or them.
	UID, GID int
}

// CloneOnHost makes on the host what Clone makes locally: Branch checked
// out (made from From, or the source's origin/<branch>, or HEAD, when the
// source has no such branch), the source's branches as origin's
// remote-tracking ones and its tags, origin set to the source as a file://
// URL (where it lies here, not on the host) and upstream to the source's
// own origin; then every file is chowned to UID:GID. The source's
// branches, tags and the start point go over as one bundle, made here in a
// temporary file and streamed as the standard input of `git bundle
// unbundle` on the host, so nothing of it is left there but the clone.
// Dest is made by CloneOnHost; a failure after that removes it.
func (g *Git) CloneOnHost(ctx context.Context, h Host, o HostCloneOptions) (Remotes, error) {
	if !path.IsAbs(o.Dest) || o.UID < 0 || o.GID < 0 {
		return Remotes{}, fmt.Errorf("internal error: a workspace on %s needs an absolute path and owner ids, got %q, %d:%d", h, o.Dest, o.UID, o.GID)
	}
	o.Dest = path.Clean(o.Dest)
	exists, start, _, err := g.plan(ctx, o.CloneOptions)
	if err != nil {
		return Remotes{}, err
	}
	if err := makeHostDir(ctx, h, o.Dest); err != nil {
		return Remotes{}, err
	}
	r := g.remotes(ctx, o.Source)
	bundle, heads, err := g.bundle(ctx, o.Source, start)
	if err == nil {
		defer os.RemoveAll(filepath.Dir(bundle))
		err = g.fillOnHost(ctx, h, o, bundle, heads, r, exists, start)
	}
	if err != nil {
		// The removal must run even when ctx is what ended the clone.
		rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, rmErr := h.Run.Run(rmCtx, execx.Cmd{Path: "rm", Args: []string{"-rf", "--", o.Dest}}); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("removing the half-made workspace %s on %s: %w (hint: remove it by hand)", o.Dest, h, rmErr))
		}
		return Remotes{}, err
	}
	return r, nil
}

// head is one ref a bundle carries.
type head struct{ sha, ref string }

// bundle writes the source's branches and tags, its HEAD and start (a
// commit, "" for none) into a bundle in a new temporary directory, and
// lists the refs it carries.
func (g *Git) bundle(ctx context.Context, source, start string) (string, []head, error) {
	dir, err := os.MkdirTemp("", "agent-vm-bundle-")
	if err != nil {
		return "", nil, fmt.Errorf("making a temporary directory for the workspace's bundle: %w", err)
	}
	file := filepath.Join(dir, "workspace.bundle")
	// HEAD keeps the bundle from being empty when the source has neither
	// branches nor tags (a detached HEAD); start, a bare commit, names no
	// ref in it but its objects go along.
	args := []string{"bundle", "create", "--quiet", file, "--branches", "--tags"}
	if g.refExists(ctx, source, "HEAD") {
		args = append(args, "HEAD")
	}
	if start != "" {
		args = append(args, start)
	}
	out, err := g.git(ctx, source, args...)
	if err == nil {
		out, err = g.git(ctx, source, "bundle", "list-heads", file)
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("bundling %s for a workspace on another host: %w", source, err)
	}
	var heads []head
	for _, l := range lines(out) {
		if sha, ref, ok := strings.Cut(l, " "); ok {
			heads = append(heads, head{sha: sha, ref: ref})
		}
	}
	return file, heads, nil
}

// makeHostDirScript makes $1 on the host, refusing one that is there
// (exit 101) or whose parent $2 is not a directory (exit 102).
const makeHostDirScript = `{ [ -e "$1" ] || [ -L "$1" ]; } && exit 101
[ -d "$2" ] || exit 102
exec mkdir -- "$1"
`

func makeHostDir(ctx context.Context, h Host, dest string) error {
	_, err := h.Run.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", makeHostDirScript, "sh", dest, path.Dir(dest)}})
	switch {
	case err == nil:
		return nil
	case execx.ExitCode(err) == 101:
		return fmt.Errorf("the workspace's directory %s on %s is there already (hint: a VM's workspace is made afresh; remove it, or choose another VM name)", dest, h)
	case execx.ExitCode(err) == 102:
		return fmt.Errorf("the directory %s for the workspace on %s is not there (hint: make the VM's directory first)", path.Dir(dest), h)
	}
	return fmt.Errorf("making the workspace's directory %s on %s: %w", dest, h, err)
}

// fillOnHost makes the clone in the empty dest on the host, every git
// there hardened (hostGit): init, the bundle's objects, its refs as a
// clone names them, the remotes, the branch checked out, and the owner.
func (g *Git) fillOnHost(ctx context.Context, h Host, o HostCloneOptions, bundle string, heads []head, r Remotes, exists bool, start string) error {
	ws := repo{work: o.Dest, gitDir: path.Join(o.Dest, ".git")}
	step := func(what string, err error) error {
		return fmt.Errorf("making the workspace %s on %s: %s: %w", o.Dest, h, what, err)
	}
	if _, err := hostGit(ctx, h, repo{}, nil, "init", "--quiet", "--", o.Dest); err != nil {
		return step("git init", err)
	}
	f, err := os.Open(bundle)
	if err != nil {
		return step("reading the bundle", err)
	}
	defer f.Close()
	// unbundle reads the bundle's header, then hands the rest (a pack) to
	// index-pack: a pipe serves as well as a file.
	if _, err := hostGit(ctx, h, ws, f, "bundle", "unbundle", "/dev/stdin"); err != nil {
		return step("unbundling the source's objects", err)
	}
	var refs strings.Builder
	for _, hd := range heads {
		if b, ok := strings.CutPrefix(hd.ref, "refs/heads/"); ok {
			fmt.Fprintf(&refs, "create refs/remotes/origin/%s %s\n", b, hd.sha)
		} else if strings.HasPrefix(hd.ref, "refs/tags/") {
			fmt.Fprintf(&refs, "create %s %s\n", hd.ref, hd.sha)
		}
	}
	if _, err := hostGit(ctx, h, ws, strings.NewReader(refs.String()), "update-ref", "--stdin"); err != nil {
		return step("writing the source's branches and tags", err)
	}
	if _, err := hostGit(ctx, h, ws, nil, "remote", "add", "origin", r.Origin); err != nil {
		return step("adding origin", err)
	}
	// As git clone does: origin/HEAD names the source's current branch,
	// and that branch is a local one too when another is not checked out
	// in its stead (Clone's --no-checkout clone makes it, then the new one).
	if srcHead, err := g.git(ctx, o.Source, "symbolic-ref", "--quiet", "--short", "HEAD"); err == nil && hasHead(heads, "refs/heads/"+srcHead) {
		if _, err := hostGit(ctx, h, ws, nil, "symbolic-ref", "refs/remotes/origin/HEAD", "refs/remotes/origin/"+srcHead); err != nil {
			return step("pointing origin/HEAD at the source's branch", err)
		}
		if !exists && srcHead != o.Branch {
			if _, err := hostGit(ctx, h, ws, nil, "branch", "--quiet", "--track", "--", srcHead, "refs/remotes/origin/"+srcHead); err != nil {
				return step(fmt.Sprintf("making the source's current branch %q", srcHead), err)
			}
		}
	}
	if r.Upstream != "" {
		if _, err := hostGit(ctx, h, ws, nil, "remote", "add", "upstream", r.Upstream); err != nil {
			return step("adding upstream", err)
		}
	}
	co := []string{"checkout", "--quiet", "-b", o.Branch, start}
	if exists {
		co = []string{"checkout", "--quiet", "--track", "-b", o.Branch, "refs/remotes/origin/" + o.Branch}
	}
	if _, err := hostGit(ctx, h, ws, nil, co...); err != nil {
		return step(fmt.Sprintf("checking out branch %q", o.Branch), err)
	}
	owner := strconv.Itoa(o.UID) + ":" + strconv.Itoa(o.GID)
	if _, err := h.Run.Run(ctx, execx.Cmd{Path: "chown", Args: []string{"-hR", "--", owner, o.Dest}}); err != nil {
		return step("handing it to "+owner+" (is the login user root?)", err)
	}
	return nil
}

func hasHead(heads []head, ref string) bool {
	for _, h := range heads {
		if h.ref == ref {
			return true
		}
	}
	return false
}

// hostGit runs git on the host, hardened as untrusted runs it in a local
// workspace (r, when it has a work tree; repo{} runs git in none), with
// stdin (nil for none).
func hostGit(ctx context.Context, h Host, r repo, stdin io.Reader, args ...string) (string, error) {
	pre := hardening()
	if r.work != "" {
		pre = append(r.args(), pre...)
	}
	res, err := h.Run.Run(ctx, execx.Cmd{Path: "git", Args: append(pre, args...), Env: untrustedEnv(), Stdin: stdin})
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(res.Stdout), "\n"), nil
}

// hostWorkspaceScript prints the real path of the workspace $1 on the
// host, refusing one that is not a directory (exit 101) or has no .git
// directory of its own (exit 102): a .git file or link would send git
// elsewhere.
const hostWorkspaceScript = `cd -P "$1" 2>/dev/null || exit 101
{ [ -d .git ] && [ ! -L .git ]; } || exit 102
pwd -P
`

// hostWorkspace is realWorkspace for a workspace on the host.
func hostWorkspace(ctx context.Context, h Host, ws string) (string, error) {
	if !path.IsAbs(ws) {
		return "", fmt.Errorf("internal error: the workspace %q on %s is not an absolute path", ws, h)
	}
	res, err := h.Run.Run(ctx, execx.Cmd{Path: "sh", Args: []string{"-c", hostWorkspaceScript, "sh", ws}})
	switch {
	case err == nil:
	case execx.ExitCode(err) == 101:
		return "", fmt.Errorf("the workspace %s on %s is not there (hint: is the VM on that host still? `agent-vm list` says)", ws, h)
	case execx.ExitCode(err) == 102:
		return "", fmt.Errorf("the workspace %s on %s has no .git directory of its own; refusing to run git there", ws, h)
	default:
		return "", fmt.Errorf("resolving the workspace %s on %s: %w", ws, h, err)
	}
	root := strings.TrimSuffix(string(res.Stdout), "\n")
	if !path.IsAbs(root) {
		return "", fmt.Errorf("resolving the workspace %s on %s: the host's shell printed %q, not a path", ws, h, termsafe.String(root))
	}
	return root, nil
}

// SyncFromHost is Sync for a workspace ws (an absolute path) on the host:
// the same fetch into the source, git here reaching the host through
// h.SSH (ssh:// and no other transport allowed), and upload-pack run
// there hardened as for a local workspace (the remote login shell runs
// the same command line). A branch the workspace lacks is an error that
// lists the branches it has, read by hardened git on the host.
func (g *Git) SyncFromHost(ctx context.Context, h Host, ws, source, branch string) (*SyncResult, error) {
	if err := g.CheckBranchName(ctx, branch); err != nil {
		return nil, err
	}
	if len(h.SSH) == 0 {
		return nil, fmt.Errorf("internal error: no command for git to reach %s with", h)
	}
	root, err := hostWorkspace(ctx, h, ws)
	if err != nil {
		return nil, err
	}
	where := fmt.Sprintf("the workspace %s on %s", ws, h)
	refs, err := hostGit(ctx, h, repo{work: root, gitDir: path.Join(root, ".git")}, nil, "for-each-ref", "--format=%(refname)", "refs/heads/")
	if err != nil {
		return nil, fmt.Errorf("listing the branches of %s: %s", where, termsafe.String(err.Error()))
	}
	if err := hasBranch(where, refs, branch); err != nil {
		return nil, err
	}
	ssh := make([]string, len(h.SSH))
	for i, a := range h.SSH {
		ssh[i] = execx.ShellQuote(a)
	}
	// The simple variant: git passes the shim only the host and the
	// command, never probes it with -G as it would an unknown program.
	return g.fetchBranch(ctx, source, branch, transport{
		where: where, url: hostURLPrefix + root, uploadPack: uploadPack(root),
		env: []string{"GIT_SSH_COMMAND=" + strings.Join(ssh, " "), "GIT_SSH_VARIANT=simple", "GIT_ALLOW_PROTOCOL=ssh"},
	})
}

// hostURLPrefix and a workspace's absolute path are the URL SyncFromHost
// fetches from; the shim ignores the host name in it.
const hostURLPrefix = "ssh://agent-vm-host"
