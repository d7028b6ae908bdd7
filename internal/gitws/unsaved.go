package gitws

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// hardening is passed to every git command run in a workspace. It turns off
// what the workspace's own config could make git execute while it reads.
func hardening() []string {
	return []string{
		"-c", "core.fsmonitor=false",
		"-c", "core.hooksPath=/dev/null",
		"-c", "core.pager=cat",
		"-c", "diff.external=",
		"-c", "log.showSignature=false",
		"-c", "gpg.program=false",
		"-c", "protocol.allow=never",
	}
}

// untrusted runs git in a workspace with hardening, plus empty overrides for
// every filter driver the workspace's config (and what it includes) defines,
// so no clean/smudge/process command ever runs.
func (g *Git) untrusted(ctx context.Context, ws string, args ...string) (string, error) {
	if !IsRepo(ws) {
		return "", fmt.Errorf("%s has no .git directory of its own; refusing to run git there", ws)
	}
	pre := []string{"-C", ws, "-c", "safe.directory=" + ws}
	pre = append(pre, hardening()...)
	drivers, err := g.filterDrivers(ctx, ws)
	if err != nil {
		return "", err
	}
	for _, d := range drivers {
		pre = append(pre, "-c", "filter."+d+".clean=", "-c", "filter."+d+".smudge=",
			"-c", "filter."+d+".process=", "-c", "filter."+d+".required=false")
	}
	res, err := g.run.Run(ctx, execx.Cmd{Path: "git", Args: append(pre, args...), Env: baseEnv()})
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(res.Stdout), "\n"), nil
}

// filterDrivers lists the filter drivers the workspace's config defines.
// Reading config executes nothing.
func (g *Git) filterDrivers(ctx context.Context, ws string) ([]string, error) {
	res, err := g.run.Run(ctx, execx.Cmd{Path: "git", Env: baseEnv(), Args: []string{"-C", ws, "-c", "safe.directory=" + ws,
		"config", "--local", "--includes", "--null", "--name-only", "--get-regexp", `^filter\.`}})
	if err != nil {
		if execx.ExitCode(err) == 1 { // no such keys
			return nil, nil
		}
		return nil, fmt.Errorf("reading the workspace's git config: %w", err)
	}
	seen := map[string]bool{}
	var out []string
	for _, key := range strings.Split(string(res.Stdout), "\x00") {
		i, j := strings.Index(key, "."), strings.LastIndex(key, ".")
		if i < 0 || j <= i {
			continue
		}
		if d := key[i+1 : j]; !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out, nil
}

// Commit is a commit that exists only in the workspace.
type Commit struct {
	Branch  string // the local branch it is on ("HEAD" when detached)
	Hash    string // abbreviated
	Subject string
}

// Unsaved is the work in a workspace that would be lost with it.
type Unsaved struct {
	Changed   []string // "XY path" for tracked files with changes, staged or not
	Untracked []string // untracked, not ignored
	Stashes   []string // "stash@{0}: ..."
	Unpushed  []Commit // on local branches, reachable from no remote
	// Risky lists workspace git settings that make git on the host run
	// commands: a warning for whoever runs git there by hand.
	Risky []string
	// ForeignOwner: the workspace belongs to another user (the guest uid,
	// when agent-vm runs as root), so git needs safe.directory there.
	ForeignOwner bool
}

// Empty reports whether nothing would be lost.
func (u *Unsaved) Empty() bool {
	return len(u.Changed) == 0 && len(u.Untracked) == 0 && len(u.Stashes) == 0 && len(u.Unpushed) == 0
}

// Inspect finds the work in ws that exists nowhere else. source, when not
// empty, is the repository the workspace was cloned from: commits that
// reached it some other way than a push from the workspace count as saved.
func (g *Git) Inspect(ctx context.Context, ws, source string) (*Unsaved, error) {
	u := &Unsaved{}
	status, err := g.untrusted(ctx, ws, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=all")
	if err != nil {
		return nil, fmt.Errorf("checking %s for uncommitted work: %w", ws, err)
	}
	u.Changed, u.Untracked = parseStatus(status)
	stashes, err := g.untrusted(ctx, ws, "stash", "list", "--format=%gd: %gs")
	if err != nil {
		return nil, fmt.Errorf("listing stashes in %s: %w", ws, err)
	}
	u.Stashes = lines(stashes)
	if u.Unpushed, err = g.unpushed(ctx, ws, source); err != nil {
		return nil, fmt.Errorf("checking %s for unpushed commits: %w", ws, err)
	}
	u.Risky = g.risky(ctx, ws)
	if fi, err := os.Stat(ws); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
			u.ForeignOwner = true
		}
	}
	return u, nil
}

// unpushed lists commits on local branches (and a detached HEAD) that no
// remote-tracking branch has and, when source is given, that the source
// repository's branches do not contain either.
func (g *Git) unpushed(ctx context.Context, ws, source string) ([]Commit, error) {
	exclude := []string{"--remotes"}
	if source != "" && IsRepo(source) {
		// The source is the user's own repository: reading it is safe.
		if out, err := g.git(ctx, source, "for-each-ref", "--format=%(objectname)", "refs/heads", "refs/tags"); err == nil {
			for _, sha := range lines(out) {
				if _, err := g.untrusted(ctx, ws, "cat-file", "-e", sha+"^{commit}"); err == nil {
					exclude = append(exclude, sha)
				}
			}
		}
	}
	branches, err := g.untrusted(ctx, ws, "for-each-ref", "--format=%(refname:short)", "refs/heads")
	if err != nil {
		return nil, err
	}
	var out []Commit
	seen := map[string]bool{}
	add := func(branch string, tip string) error {
		args := append([]string{"rev-list", "--format=%h %s", "--no-commit-header", tip, "--not"}, exclude...)
		text, err := g.untrusted(ctx, ws, args...)
		if err != nil {
			return err
		}
		for _, l := range lines(text) {
			hash, subject, _ := strings.Cut(l, " ")
			if !seen[hash] {
				seen[hash] = true
				out = append(out, Commit{Branch: branch, Hash: hash, Subject: subject})
			}
		}
		return nil
	}
	for _, b := range lines(branches) {
		if err := add(b, "refs/heads/"+b); err != nil {
			return nil, err
		}
	}
	if _, err := g.untrusted(ctx, ws, "symbolic-ref", "--quiet", "HEAD"); err != nil {
		if err := add("HEAD", "HEAD"); err != nil { // detached HEAD
			return nil, err
		}
	}
	return out, nil
}

// riskyKey matches workspace config that makes git run a command.
var riskyKey = regexp.MustCompile(`^(core\.(fsmonitor|hookspath|sshcommand|gitproxy|pager|editor|askpass|alternaterefscommand)|` +
	`remote\..*\.(uploadpack|receivepack|url|pushurl)|url\..*\.(insteadof|pushinsteadof)|filter\..*\.(clean|smudge|process)|` +
	`diff\..*\.(textconv|command)|merge\..*\.driver|gpg\.program|gpg\..*\.program|credential\..*|include\.path|includeif\..*)$`)

// risky lists workspace settings and hooks that would run commands on the
// host if someone ran git there by hand. The origin and upstream URLs
// agent-vm set itself are not reported unless they changed.
func (g *Git) risky(ctx context.Context, ws string) []string {
	var out []string
	res, err := g.run.Run(ctx, execx.Cmd{Path: "git", Env: baseEnv(), Args: []string{"-C", ws, "-c", "safe.directory=" + ws,
		"config", "--local", "--null", "--list"}})
	if err == nil {
		for _, kv := range strings.Split(string(res.Stdout), "\x00") {
			key, val, _ := strings.Cut(kv, "\n")
			if key == "" || !riskyKey.MatchString(strings.ToLower(key)) {
				continue
			}
			if (key == "remote.origin.url" && strings.HasPrefix(val, "file://")) || key == "remote.upstream.url" {
				continue
			}
			out = append(out, fmt.Sprintf("git config %s = %s", key, val))
		}
	}
	hooks, _ := os.ReadDir(filepath.Join(ws, ".git", "hooks"))
	for _, h := range hooks {
		if fi, err := h.Info(); err == nil && !strings.HasSuffix(h.Name(), ".sample") && fi.Mode()&0o111 != 0 {
			out = append(out, "hook .git/hooks/"+h.Name())
		}
	}
	return out
}

// parseStatus splits `git status --porcelain=v1 -z` into changed tracked
// paths ("XY path") and untracked paths.
func parseStatus(out string) (changed, untracked []string) {
	fields := strings.Split(out, "\x00")
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if len(f) < 4 {
			continue
		}
		xy, path := f[:2], f[3:]
		switch {
		case xy == "??":
			untracked = append(untracked, path)
		case xy == "!!":
		default:
			changed = append(changed, xy+" "+path)
			if xy[0] == 'R' || xy[0] == 'C' {
				i++ // the next field is the rename's source
			}
		}
	}
	return changed, untracked
}

func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
