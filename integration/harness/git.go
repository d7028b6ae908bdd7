package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Repo is a scenario's test data: a git repository with a bare remote, made
// with the real git, as a user's project would be.
type Repo struct {
	Dir    string // the working repository VMs are created from
	Remote string // its origin, a bare repository
}

// NewRepo makes parent/remote.git and parent/src, commits files (path ->
// content) plus a README on main, and pushes main to the remote.
func NewRepo(ctx context.Context, parent string, files map[string]string) (*Repo, error) {
	r := &Repo{Dir: filepath.Join(parent, "src"), Remote: filepath.Join(parent, "remote.git")}
	if _, err := Git(ctx, parent, "init", "--quiet", "--bare", "--initial-branch=main", r.Remote); err != nil {
		return nil, err
	}
	if _, err := Git(ctx, parent, "init", "--quiet", "--initial-branch=main", r.Dir); err != nil {
		return nil, err
	}
	all := map[string]string{"README.md": "# a project for agent-vm's integration test\n"}
	for p, c := range files {
		all[p] = c
	}
	for p, c := range all {
		full := filepath.Join(r.Dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			return nil, err
		}
	}
	for _, args := range [][]string{
		{"add", "--all"},
		{"commit", "--quiet", "-m", "initial commit"},
		{"remote", "add", "origin", r.Remote},
		{"push", "--quiet", "--set-upstream", "origin", "main"},
	} {
		if _, err := Git(ctx, r.Dir, args...); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Git runs the real git in dir, isolated from the user's and the system's
// git configuration, with a fixed identity. Its error carries git's stderr.
func Git(ctx context.Context, dir string, args ...string) (string, error) {
	argv := append([]string{"-c", "safe.directory=*", "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null"}, args...)
	cmd := exec.CommandContext(ctx, "git", argv...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=agent-vm integration test", "GIT_AUTHOR_EMAIL=itest@agent-vm.invalid",
		"GIT_COMMITTER_NAME=agent-vm integration test", "GIT_COMMITTER_EMAIL=itest@agent-vm.invalid",
		"GIT_TERMINAL_PROMPT=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s (in %s): %w: %s", strings.Join(args, " "), dir, err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}
