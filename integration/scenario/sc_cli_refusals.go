package scenario

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
)

// checkDestroyRefuses commits in the workspace without pushing; destroy
// must refuse (exit 1), say which commit would be lost, and keep the VM.
func checkDestroyRefuses(ctx context.Context, s *harness.S, st *blackbox.Status) error {
	subject := "itest: unpushed work " + harness.RandHex(4)
	ws := st.Paths.Workspace
	if err := os.WriteFile(filepath.Join(ws, "unpushed.txt"), []byte(subject+"\n"), 0o644); err != nil {
		return err
	}
	if _, err := harness.Git(ctx, ws, "add", "unpushed.txt"); err != nil {
		return err
	}
	if _, err := harness.Git(ctx, ws, "commit", "--quiet", "-m", subject); err != nil {
		return err
	}
	hash, _ := harness.Git(ctx, ws, "rev-parse", "--short", "HEAD")
	res := s.AgentVM(ctx, "destroy", st.Branch)
	if err := harness.Want(res, 1); err != nil {
		return err
	}
	report := res.Stdout + res.Stderr
	if !strings.Contains(report, subject) && !strings.Contains(report, hash) {
		return harness.Failf(res, "the refusal does not name the unpushed commit %s %q", hash, subject)
	}
	if !harness.IsDir(st.Paths.Dir) {
		return harness.Failf(res, "destroy refused, yet %s is gone", st.Paths.Dir)
	}
	_, err := s.OK(ctx, "status", "--json", st.Branch)
	return err
}

// checkAsPrinted runs agent-vm the way its usage lines (`status [BRANCH]
// [--json]`) and its own hints write commands, flags after the branch: the
// command a refused destroy suggests must do what it says.
func checkAsPrinted(ctx context.Context, s *harness.S, rp *harness.Repo) error {
	const branch = "itest/hint"
	if _, err := s.Create(ctx, rp.Dir, branch); err != nil {
		return err
	}
	res := s.AgentVM(ctx, "status", branch, "--json")
	if err := harness.Want(res, 0); err != nil {
		return err
	}
	st, err := harness.ParseStatus([]byte(res.Stdout), harness.StatusKeys())
	if err != nil {
		return harness.Failf(res, "%v", err)
	}
	if _, err := harness.Git(ctx, st.Paths.Workspace, "commit", "--quiet", "--allow-empty", "-m", "itest: unpushed"); err != nil {
		return err
	}
	res = s.AgentVM(ctx, "destroy", branch)
	if err := harness.Want(res, 1); err != nil {
		return err
	}
	var hint string
	for _, l := range strings.Split(res.Stdout+res.Stderr, "\n") {
		if i := strings.Index(l, "agent-vm destroy "); i >= 0 && strings.Contains(l, "--force") {
			hint = strings.Trim(l[i:], " `.")
		}
	}
	if hint == "" {
		return harness.Failf(res, "the refusal suggests no `agent-vm destroy ... --force` command")
	}
	args, err := harness.ShellSplit(strings.TrimPrefix(hint, "agent-vm "))
	if err != nil {
		return harness.Failf(res, "the suggested command %q: %v", hint, err)
	}
	res = s.AgentVM(ctx, args...)
	if err := harness.Want(res, 0); err != nil {
		return harness.Failf(res, "the command the refusal suggests, `%s`, fails: %s", hint, res.Outcome())
	}
	return checkGone(ctx, s, branch, st.Paths.Dir)
}

// checkGone: the VM is unknown to agent-vm and its directory is gone.
func checkGone(ctx context.Context, s *harness.S, branch, dir string) error {
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		return harness.Failf(nil, "%s still exists after destroy (%v)", dir, err)
	}
	res := s.AgentVM(ctx, "status", "--json", branch)
	return harness.Want(res, 1)
}

// checkUnknownVM: asking about a VM that does not exist is exit 1 with the
// name and a hint on stderr, and nothing on stdout.
func checkUnknownVM(ctx context.Context, s *harness.S) error {
	name := "no-such-vm-" + harness.RandHex(3)
	for _, args := range [][]string{{"status", name}, {"status", "--json", name}, {"destroy", name}, {"ssh-config", name}} {
		res := s.AgentVM(ctx, args...)
		if err := harness.Want(res, 1); err != nil {
			return err
		}
		if !strings.HasPrefix(harness.LastLine(res.Stderr), "agent-vm: ") || !strings.Contains(res.Stderr, name) || !strings.Contains(res.Stderr, "hint") {
			return harness.Failf(res, "want an `agent-vm: ...` error naming %q with a hint on stderr", name)
		}
		if strings.TrimSpace(res.Stdout) != "" {
			return harness.Failf(res, "an error printed data on stdout")
		}
	}
	return nil
}

// checkUsageErrors: mistakes in how agent-vm is called are exit 2, say what
// was wrong, and suggest the command that was probably meant.
func checkUsageErrors(ctx context.Context, s *harness.S) error {
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
		res := s.AgentVM(ctx, c.args...)
		if err := harness.Want(res, 2); err != nil {
			return err
		}
		if !strings.Contains(res.Stderr, c.mentions) {
			return harness.Failf(res, "the usage error does not mention %s", c.mentions)
		}
		if strings.Contains(res.Stderr, "goroutine ") {
			return harness.Failf(res, "agent-vm crashed")
		}
	}
	return nil
}

// checkRefusalEscapes: the workspace is the agent's, so a file name there
// may carry a newline, a forged "it is safe" line and escape sequences.
// destroy's refusal, as the CLI prints it, shows that name escaped: on its
// own line, with no control character reaching the terminal.
func checkRefusalEscapes(ctx context.Context, s *harness.S, st *blackbox.Status) error {
	forged := "it is safe: agent-vm destroy " + st.Slug + " --force" // a slug has no "/"
	name := "itest-hostile\n" + forged + "\x1b]0;pwned\x07\x1b[2J"
	path := filepath.Join(st.Paths.Workspace, name)
	if err := os.WriteFile(path, []byte("x\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(path)
	res := s.AgentVM(ctx, "destroy", st.Branch)
	if err := harness.Want(res, 1); err != nil {
		return err
	}
	out := res.Stdout + res.Stderr
	escaped := `itest-hostile\n` + forged + `\x1b]0;pwned\x07\x1b[2J`
	if !strings.Contains(out, escaped) {
		return harness.Failf(res, "the refusal does not show the file name escaped as %q", escaped)
	}
	if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "\n"+forged) {
		return harness.Failf(res, "the refusal passes the file name's control characters to the terminal")
	}
	if !harness.IsDir(st.Paths.Dir) {
		return harness.Failf(res, "destroy refused, yet %s is gone", st.Paths.Dir)
	}
	return nil
}
