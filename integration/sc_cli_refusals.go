package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/blackbox"
)

// checkDestroyRefuses commits in the workspace without pushing; destroy
// must refuse (exit 1), say which commit would be lost, and keep the VM.
func checkDestroyRefuses(ctx context.Context, s *S, st *blackbox.Status) error {
	subject := "itest: unpushed work " + randHex(4)
	ws := st.Paths.Workspace
	if err := os.WriteFile(filepath.Join(ws, "unpushed.txt"), []byte(subject+"\n"), 0o644); err != nil {
		return err
	}
	if _, err := git(ctx, ws, "add", "unpushed.txt"); err != nil {
		return err
	}
	if _, err := git(ctx, ws, "commit", "--quiet", "-m", subject); err != nil {
		return err
	}
	hash, _ := git(ctx, ws, "rev-parse", "--short", "HEAD")
	res := s.agentVM(ctx, "destroy", st.Branch)
	if err := want(res, 1); err != nil {
		return err
	}
	report := res.Stdout + res.Stderr
	if !strings.Contains(report, subject) && !strings.Contains(report, hash) {
		return failf(res, "the refusal does not name the unpushed commit %s %q", hash, subject)
	}
	if !isDir(st.Paths.Dir) {
		return failf(res, "destroy refused, yet %s is gone", st.Paths.Dir)
	}
	_, err := s.ok(ctx, "status", "--json", st.Branch)
	return err
}

// checkAsPrinted runs agent-vm the way its usage lines (`status [BRANCH]
// [--json]`) and its own hints write commands, flags after the branch: the
// command a refused destroy suggests must do what it says.
func checkAsPrinted(ctx context.Context, s *S, rp *repo) error {
	const branch = "itest/hint"
	if _, err := s.create(ctx, rp.Dir, branch); err != nil {
		return err
	}
	res := s.agentVM(ctx, "status", branch, "--json")
	if err := want(res, 0); err != nil {
		return err
	}
	st, err := parseStatus([]byte(res.Stdout), statusKeys())
	if err != nil {
		return failf(res, "%v", err)
	}
	if _, err := git(ctx, st.Paths.Workspace, "commit", "--quiet", "--allow-empty", "-m", "itest: unpushed"); err != nil {
		return err
	}
	res = s.agentVM(ctx, "destroy", branch)
	if err := want(res, 1); err != nil {
		return err
	}
	var hint string
	for _, l := range strings.Split(res.Stdout+res.Stderr, "\n") {
		if i := strings.Index(l, "agent-vm destroy "); i >= 0 && strings.Contains(l, "--force") {
			hint = strings.Trim(l[i:], " `.")
		}
	}
	if hint == "" {
		return failf(res, "the refusal suggests no `agent-vm destroy ... --force` command")
	}
	args, err := shellSplit(strings.TrimPrefix(hint, "agent-vm "))
	if err != nil {
		return failf(res, "the suggested command %q: %v", hint, err)
	}
	res = s.agentVM(ctx, args...)
	if err := want(res, 0); err != nil {
		return failf(res, "the command the refusal suggests, `%s`, fails: %s", hint, res.Outcome())
	}
	return checkGone(ctx, s, branch, st.Paths.Dir)
}

// checkGone: the VM is unknown to agent-vm and its directory is gone.
func checkGone(ctx context.Context, s *S, branch, dir string) error {
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		return failf(nil, "%s still exists after destroy (%v)", dir, err)
	}
	res := s.agentVM(ctx, "status", "--json", branch)
	return want(res, 1)
}

// checkUnknownVM: asking about a VM that does not exist is exit 1 with the
// name and a hint on stderr, and nothing on stdout.
func checkUnknownVM(ctx context.Context, s *S) error {
	name := "no-such-vm-" + randHex(3)
	for _, args := range [][]string{{"status", name}, {"status", "--json", name}, {"destroy", name}, {"ssh-config", name}} {
		res := s.agentVM(ctx, args...)
		if err := want(res, 1); err != nil {
			return err
		}
		if !strings.HasPrefix(lastLine(res.Stderr), "agent-vm: ") || !strings.Contains(res.Stderr, name) || !strings.Contains(res.Stderr, "hint") {
			return failf(res, "want an `agent-vm: ...` error naming %q with a hint on stderr", name)
		}
		if strings.TrimSpace(res.Stdout) != "" {
			return failf(res, "an error printed data on stdout")
		}
	}
	return nil
}

// checkUsageErrors: mistakes in how agent-vm is called are exit 2, say what
// was wrong, and suggest the command that was probably meant.
func checkUsageErrors(ctx context.Context, s *S) error {
	cases := []struct {
		args     []string
		mentions string
	}{
		{[]string{"list", "--bogus-flag"}, "bogus-flag"},
		{[]string{"statu"}, `"status"`},
		{[]string{"destory", "x"}, `"destroy"`},
		{[]string{"status", "a", "b"}, "status"},
		{[]string{"--log-format", "xml", "list"}, "xml"},
		{[]string{"create", "--cpus", "0"}, "cpus"},
	}
	for _, c := range cases {
		res := s.agentVM(ctx, c.args...)
		if err := want(res, 2); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, c.mentions) {
			return failf(res, "the usage error does not mention %s", c.mentions)
		}
		if strings.Contains(res.Stderr, "goroutine ") {
			return failf(res, "agent-vm crashed")
		}
	}
	return nil
}

// checkRefusalEscapes: the workspace is the agent's, so a file name there
// may carry a newline, a forged "it is safe" line and escape sequences.
// destroy's refusal, as the CLI prints it, shows that name escaped: on its
// own line, with no control character reaching the terminal.
func checkRefusalEscapes(ctx context.Context, s *S, st *blackbox.Status) error {
	forged := "it is safe: agent-vm destroy " + st.Slug + " --force" // a slug has no "/"
	name := "itest-hostile\n" + forged + "\x1b]0;pwned\x07\x1b[2J"
	path := filepath.Join(st.Paths.Workspace, name)
	if err := os.WriteFile(path, []byte("x\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(path)
	res := s.agentVM(ctx, "destroy", st.Branch)
	if err := want(res, 1); err != nil {
		return err
	}
	out := res.Stdout + res.Stderr
	escaped := `itest-hostile\n` + forged + `\x1b]0;pwned\x07\x1b[2J`
	if !strings.Contains(out, escaped) {
		return failf(res, "the refusal does not show the file name escaped as %q", escaped)
	}
	if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "\n"+forged) {
		return failf(res, "the refusal passes the file name's control characters to the terminal")
	}
	if !isDir(st.Paths.Dir) {
		return failf(res, "destroy refused, yet %s is gone", st.Paths.Dir)
	}
	return nil
}
