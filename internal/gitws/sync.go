package gitws

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// SyncRefs is where Sync puts a VM's branch in the source repository:
// SyncRefs + the branch. Inspect counts what these refs reach as saved.
const SyncRefs = "refs/remotes/agent-vm/"

// SyncResult is what Sync did to the source repository's ref.
type SyncResult struct {
	Branch string `json:"branch"` // the VM's branch, as the workspace names it
	Ref    string `json:"ref"`    // SyncRefs + Branch, in the source repository
	Old    string `json:"old"`    // the ref's commit before; "" when it was new
	New    string `json:"new"`    // its commit now
	// Commits counts the commits New brought that neither Old nor any
	// other ref of the source repository reached.
	Commits int `json:"commits"`
	// Forced: Old is not an ancestor of New (the agent rewrote its branch).
	Forced bool `json:"forced"`
	// Warnings are what the caller found the user should know of the
	// synced branch (a changed network policy file).
	Warnings []string `json:"warnings,omitempty"`
}

// Sync fetches branch from the workspace ws into the source repository as
// SyncRefs+branch, force-updated. git runs in the source (the user's own
// repository); in the workspace runs only upload-pack, hardened as every
// git run there is (see uploadPack), so nothing of the workspace's config,
// hooks or attributes executes. No tags, submodules or FETCH_HEAD; objects
// are checked (fsck) as they arrive. A branch the workspace does not have
// is an error that lists the branches it has, and writes nothing.
func (g *Git) Sync(ctx context.Context, ws, source, branch string) (*SyncResult, error) {
	if err := g.CheckBranchName(ctx, branch); err != nil {
		return nil, err
	}
	root, err := realWorkspace(ws)
	if err != nil {
		return nil, err
	}
	where := "the workspace " + ws
	refs, err := g.untrusted(ctx, repo{work: root, gitDir: filepath.Join(root, ".git")}, "for-each-ref", "--format=%(refname)", "refs/heads/")
	if err != nil {
		return nil, fmt.Errorf("listing the branches of %s: %s", where, termsafe.String(err.Error()))
	}
	if err := hasBranch(where, refs, branch); err != nil {
		return nil, err
	}
	return g.fetchBranch(ctx, source, branch, transport{
		where: where, url: root, uploadPack: uploadPack(root),
		config: []string{"-c", "protocol.file.allow=always"},
	})
}

// transport is how Sync's fetch reaches a workspace: the only part in
// which a local workspace and one on a remote host differ.
type transport struct {
	where      string   // the workspace, as errors name it
	url        string   // the workspace, as the fetch names it
	uploadPack string   // --upload-pack: the program run there (uploadPack)
	config     []string // -c options of git's that let it use the transport
	env        []string // variables that do, beyond baseEnv
}

// fetchBranch fetches branch over t into source as SyncRefs+branch,
// force-updated, objects checked as they arrive, no tags, submodules or
// FETCH_HEAD, and counts what it brought.
func (g *Git) fetchBranch(ctx context.Context, source, branch string, t transport) (*SyncResult, error) {
	res := &SyncResult{Branch: branch, Ref: SyncRefs + branch}
	res.Old, _ = g.git(ctx, source, "rev-parse", "--verify", "--quiet", res.Ref)
	args := append(append([]string{"-c", "transfer.fsckObjects=true", "-c", "fetch.fsckObjects=true"}, t.config...),
		"fetch", "--no-tags", "--no-recurse-submodules", "--no-write-fetch-head", "--upload-pack="+t.uploadPack,
		"--end-of-options", t.url, "+refs/heads/"+branch+":"+res.Ref)
	if _, err := g.gitEnv(ctx, source, t.env, args...); err != nil {
		// Its stderr carries upload-pack's, which quotes the workspace.
		return nil, fmt.Errorf("fetching branch %q from %s into %s: %s", termsafe.String(branch), t.where, source, termsafe.String(err.Error()))
	}
	var err error
	if res.New, err = g.git(ctx, source, "rev-parse", "--verify", "--quiet", res.Ref); err != nil {
		return nil, fmt.Errorf("reading %s in %s after the fetch: %w", res.Ref, source, err)
	}
	if res.Old == res.New {
		return res, nil
	}
	count := []string{"rev-list", "--count", res.New, "--not", "--exclude=" + res.Ref, "--all"}
	if res.Old != "" {
		count = append(count, res.Old)
		_, err := g.git(ctx, source, "merge-base", "--is-ancestor", res.Old, res.New)
		res.Forced = execx.ExitCode(err) == 1
	}
	n, err := g.git(ctx, source, count...)
	if err != nil {
		return nil, fmt.Errorf("counting the commits %s brought: %w", res.Ref, err)
	}
	if _, err := fmt.Sscan(n, &res.Commits); err != nil {
		return nil, fmt.Errorf("counting the commits %s brought: git printed %q", res.Ref, n)
	}
	return res, nil
}

// hasBranch refuses a workspace (where) whose branches, refs as
// for-each-ref lists them, lack branch, naming the branches it has (the
// agent wrote their names: escaped).
func hasBranch(where, refs, branch string) error {
	var have []string
	for _, ref := range lines(refs) {
		if ref == "refs/heads/"+branch {
			return nil
		}
		have = append(have, termsafe.String(strings.TrimPrefix(ref, "refs/heads/")))
	}
	list := "it has no branches"
	switch {
	case len(have) > maxListed:
		list = fmt.Sprintf("its branches: %s and %d more", strings.Join(have[:maxListed], ", "), len(have)-maxListed)
	case len(have) > 0:
		list = "its branches: " + strings.Join(have, ", ")
	}
	return fmt.Errorf("%s has no branch %q (the agent deleted or renamed it); %s (hint: give the work back its name in the VM, e.g. `git branch -m OTHER %s`, then sync again)",
		where, termsafe.String(branch), list, termsafe.String(execx.ShellQuote(branch)))
}

// uploadPack is the --upload-pack of Sync's fetch: the one program that
// runs in the workspace. git runs it through sh with the workspace's path
// appended, quoted, so every word here is quoted too. It is git with
// hardening, the workspace named safe whoever owns it (upload-pack refuses
// a repository of another user, e.g. the guest's uid when agent-vm runs as
// root), and untrustedVars set with env(1): git clears its -c options
// (GIT_CONFIG_PARAMETERS), GIT_NO_REPLACE_OBJECTS and GIT_GRAFT_FILE from
// the environment of a local upload-pack, so none of the fetch's reaches
// it. (A grafts file in the workspace would otherwise cut history out of
// the pack, and the fetch fail.) upload-pack runs no hook, filter or
// fsmonitor, and honours uploadpack.packObjectsHook only from the user's
// own config; the hardening holds should a git version start to.
func uploadPack(ws string) string {
	argv := append([]string{"env"}, untrustedVars()...)
	argv = append(append(argv, "git"), hardening()...)
	argv = append(argv, "-c", "safe.directory="+ws, "-c", "safe.directory="+filepath.Join(ws, ".git"), "upload-pack")
	for i, a := range argv {
		argv[i] = execx.ShellQuote(a)
	}
	return strings.Join(argv, " ")
}
