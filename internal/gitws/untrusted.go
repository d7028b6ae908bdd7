package gitws

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// hardening is passed to every git command run in a workspace. It turns off
// what the workspace's own config could make git execute while it reads.
func hardening() []string {
	return []string{
		"-c", "core.fsmonitor=false",
		"-c", "core.hooksPath=/dev/null",
		"-c", "core.pager=cat",
		"-c", "core.bare=false",
		"-c", "core.untrackedCache=false",
		"-c", "diff.external=",
		"-c", "log.showSignature=false",
		"-c", "gpg.program=false",
		"-c", "protocol.allow=never",
		"-c", "submodule.recurse=false",
	}
}

// untrustedEnv adds to baseEnv what keeps a workspace from rewriting
// history as git reads it (replace refs and a grafts file could make an
// unpushed commit look like an ancestor of a remote-tracking branch) and
// from fetching: a workspace made a partial clone would have git fetch
// each object it lacks from its promisor remote, and an ext:: URL there
// runs a command. GIT_ALLOW_PROTOCOL empty allows no transport at all,
// whatever the workspace's protocol.<name>.allow says (that wins over -c
// protocol.allow=never); GIT_NO_LAZY_FETCH stops the fetch before that.
func untrustedEnv() []string {
	return append(baseEnv(), untrustedVars()...)
}

// untrustedVars are the variables of untrustedEnv beyond baseEnv.
func untrustedVars() []string {
	return []string{"GIT_NO_REPLACE_OBJECTS=1", "GIT_GRAFT_FILE=/dev/null", "GIT_NO_LAZY_FETCH=1", "GIT_ALLOW_PROTOCOL="}
}

// repo is a workspace, or a submodule inside it, as git is pointed at it:
// both directories given explicitly, so nothing in the workspace (a .git
// file, core.worktree) can send git elsewhere.
type repo struct {
	work   string // the work tree
	gitDir string // its git directory: a real directory inside the workspace
	path   string // where it lies in the workspace ("" for the workspace), for reports
}

func (r repo) args() []string {
	return []string{"-C", r.work, "--git-dir=" + r.gitDir, "--work-tree=" + r.work,
		"-c", "safe.directory=" + r.work, "-c", "safe.directory=" + r.gitDir}
}

// untrusted runs git in a workspace repository with hardening, plus empty
// overrides for every filter driver its config (and what it includes)
// defines, so no clean/smudge/process command ever runs.
func (g *Git) untrusted(ctx context.Context, r repo, args ...string) (string, error) {
	if fi, err := os.Lstat(r.gitDir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%s is not a git directory of its own; refusing to run git there", r.gitDir)
	}
	pre := append(r.args(), hardening()...)
	drivers, err := g.filterDrivers(ctx, r)
	if err != nil {
		return "", err
	}
	for _, d := range drivers {
		pre = append(pre, "-c", "filter."+d+".clean=", "-c", "filter."+d+".smudge=",
			"-c", "filter."+d+".process=", "-c", "filter."+d+".required=false")
	}
	res, err := g.run.Run(ctx, execx.Cmd{Path: "git", Args: append(pre, args...), Env: untrustedEnv()})
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(res.Stdout), "\n"), nil
}

// filterDrivers lists the filter drivers the repository's own config
// defines: .git/config, its worktree config, and what they include. (A
// driver only the user's global config defines, such as git-lfs, is the
// user's own and runs as it would anywhere.) Reading config executes
// nothing.
func (g *Git) filterDrivers(ctx context.Context, r repo) ([]string, error) {
	res, err := g.run.Run(ctx, execx.Cmd{Path: "git", Env: untrustedEnv(), Args: append(r.args(),
		"config", "--includes", "--show-scope", "--null", "--name-only", "--get-regexp", `^filter\.`)})
	if err != nil {
		if execx.ExitCode(err) == 1 { // no such keys
			return nil, nil
		}
		return nil, fmt.Errorf("reading the workspace's git config: %w", err)
	}
	seen := map[string]bool{}
	var out []string
	fields := strings.Split(string(res.Stdout), "\x00")
	for k := 0; k+1 < len(fields); k += 2 {
		scope, key := fields[k], fields[k+1]
		i, j := strings.Index(key, "."), strings.LastIndex(key, ".")
		if (scope != "local" && scope != "worktree") || i < 0 || j <= i {
			continue
		}
		if d := key[i+1 : j]; !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out, nil
}

// riskyKey matches workspace config that makes git run a command.
var riskyKey = regexp.MustCompile(`^(core\.(fsmonitor|hookspath|sshcommand|gitproxy|pager|editor|askpass|alternaterefscommand)|` +
	`remote\..*\.(uploadpack|receivepack|url|pushurl)|url\..*\.(insteadof|pushinsteadof)|filter\..*\.(clean|smudge|process)|` +
	`diff\..*\.(textconv|command)|merge\..*\.driver|gpg\.program|gpg\..*\.program|credential\..*|include\.path|includeif\..*)$`)

// risky lists a repository's settings (its own and its worktree config) and
// hooks that would run commands on the host if someone ran git there by
// hand. The origin and upstream URLs agent-vm set itself are not reported
// unless they changed; a submodule's origin is its own business.
func (g *Git) risky(ctx context.Context, r repo) []string {
	var out []string
	res, err := g.run.Run(ctx, execx.Cmd{Path: "git", Env: untrustedEnv(), Args: append(r.args(),
		"config", "--show-scope", "--null", "--list")})
	if err == nil {
		fields := strings.Split(string(res.Stdout), "\x00")
		for i := 0; i+1 < len(fields); i += 2 {
			scope := fields[i]
			key, val, _ := strings.Cut(fields[i+1], "\n")
			if scope != "local" && scope != "worktree" {
				continue
			}
			lower := strings.ToLower(key)
			if !riskyKey.MatchString(lower) && !(strings.HasPrefix(lower, "submodule.") && strings.HasSuffix(lower, ".update") && strings.HasPrefix(val, "!")) {
				continue
			}
			if r.path == "" && ((key == "remote.origin.url" && strings.HasPrefix(val, "file://")) || key == "remote.upstream.url") {
				continue
			}
			if r.path != "" && key == "remote.origin.url" {
				continue
			}
			out = append(out, fmt.Sprintf("git config %s = %s", key, val))
		}
	}
	hooks, _ := os.ReadDir(filepath.Join(r.gitDir, "hooks"))
	for _, h := range hooks {
		if fi, err := h.Info(); err == nil && !strings.HasSuffix(h.Name(), ".sample") && fi.Mode()&0o111 != 0 {
			where := ".git/hooks/" + h.Name()
			if r.path != "" {
				where = filepath.Join(r.gitDir, "hooks", h.Name())
			}
			out = append(out, "hook "+where)
		}
	}
	return out
}
