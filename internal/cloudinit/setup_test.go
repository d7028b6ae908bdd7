package cloudinit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/secret"
)

// TestSecretEnvScript runs guest/secret-env on a copy of an
// /etc/environment: the placeholders of this start replace an earlier
// start's, and no other line changes.
func TestSecretEnvScript(t *testing.T) {
	script := guestScripts(t)["secret-env"]
	const envLine = "env=/etc/environment\n"
	if !strings.Contains(script, envLine) {
		t.Fatalf("guest/secret-env does not set %q", envLine)
	}
	if !strings.Contains(script, "placeholder="+secret.PlaceholderPrefix+"\n") {
		t.Fatalf("guest/secret-env does not recognise placeholders by %q", secret.PlaceholderPrefix)
	}
	dir := t.TempDir()
	env := filepath.Join(dir, "environment")
	script = strings.Replace(script, envLine, "env="+env+"\n", 1)
	old := "PATH=/usr/bin:/bin\nhttp_proxy=http://10.0.2.100:3128\nGH_TOKEN=" + secret.PlaceholderPrefix + "0123\nNOTE=keep agent-vm-placeholder- in the middle\n"
	if err := os.WriteFile(env, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: "sh", Args: append([]string{"-c", script, "agent-vm-secret-env"}, args...)})
		if err != nil {
			t.Fatalf("secret-env: %v\n%s", err, res.Stderr)
		}
	}
	run("ANTHROPIC_API_KEY="+secret.PlaceholderPrefix+"abcd", "OPENAI_API_KEY="+secret.PlaceholderPrefix+"ef01")
	got, _ := os.ReadFile(env)
	want := "PATH=/usr/bin:/bin\nhttp_proxy=http://10.0.2.100:3128\nNOTE=keep agent-vm-placeholder- in the middle\n" +
		"ANTHROPIC_API_KEY=" + secret.PlaceholderPrefix + "abcd\nOPENAI_API_KEY=" + secret.PlaceholderPrefix + "ef01\n"
	if string(got) != want {
		t.Errorf("after the first start:\n%s\nwant:\n%s", got, want)
	}
	run() // a start with no secrets left
	got, _ = os.ReadFile(env)
	if want := "PATH=/usr/bin:/bin\nhttp_proxy=http://10.0.2.100:3128\nNOTE=keep agent-vm-placeholder- in the middle\n"; string(got) != want {
		t.Errorf("after a start without secrets:\n%s\nwant:\n%s", got, want)
	}
	if fi, err := os.Stat(env); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the file's mode: %v %v, want 0644", fi.Mode(), err)
	}
}

func TestSetup(t *testing.T) {
	if s, err := Setup(SetupConfig{}); s != "" || err != nil {
		t.Errorf("Setup with nothing to do = %q, %v; want no script", s, err)
	}
	s, err := Setup(SetupConfig{CACerts: []string{"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"},
		Placeholders: map[string]string{"B": "pb", "A": "pa"}, GitCredentials: map[string]string{"github.com": "pg"}})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	git, err := gitHTTPSConfig(map[string]string{"github.com": "pg"})
	if err != nil {
		t.Fatal(err)
	}
	if lines[0] != "set -eu" || !strings.Contains(s, "agent-vm-ca-certs") || !strings.Contains(s, " agent-vm-secret-env A=pa B=pb\n") || !strings.HasSuffix(s, " agent-vm-git-https "+execx.ShellQuote(git)+"\n") {
		t.Errorf("Setup's script, names sorted after the CA step, git's configuration rendered:\n%s", s)
	}
	for _, bad := range []string{"git\nhub.com", `git"hub.com`, "github.com/x", "git hub.com"} {
		if _, err := Setup(SetupConfig{GitCredentials: map[string]string{bad: "pg"}}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("Setup with the git host %q: %v, want an error naming it", bad, err)
		}
	}
}

// TestGitHTTPSScript runs guest/git-https against a scratch system
// gitconfig: a remote in ssh form becomes https, git's credential fill
// answers the placeholder for that host alone, and a later start's
// hosts replace an earlier start's.
func TestGitHTTPSScript(t *testing.T) {
	script := guestScripts(t)["git-https"]
	const dirLine = "dir=/etc/agent-vm\n"
	if !strings.Contains(script, dirLine) {
		t.Fatalf("guest/git-https does not set %q", dirLine)
	}
	tmp := t.TempDir()
	script = strings.Replace(script, dirLine, "dir="+filepath.Join(tmp, "agent-vm")+"\n", 1)
	env := []string{"GIT_CONFIG_SYSTEM=" + filepath.Join(tmp, "gitconfig"), "GIT_CONFIG_GLOBAL=/dev/null", "HOME=" + tmp,
		"GIT_CONFIG_NOSYSTEM=", "GIT_TERMINAL_PROMPT=0", "PATH=" + os.Getenv("PATH")}
	cmd := func(stdin, name string, args ...string) (string, error) {
		c := exec.Command(name, args...)
		c.Env, c.Stdin = env, strings.NewReader(stdin)
		out, err := c.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return strings.TrimSpace(string(out)), err
	}
	git := func(stdin string, args ...string) string {
		t.Helper()
		out, err := cmd(stdin, "git", args...)
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return out
	}
	run := func(creds map[string]string) {
		t.Helper()
		config, err := gitHTTPSConfig(creds)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cmd("", "sh", "-c", script, "agent-vm-git-https", config); err != nil {
			t.Fatalf("git-https: %v", err)
		}
	}
	ph := secret.PlaceholderPrefix + "0123abcd"
	// The system configuration as cloud-init leaves it (guest/gitconfig).
	proxy, err := guestFS.ReadFile("guest/gitconfig")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "gitconfig"), proxy, 0o644); err != nil {
		t.Fatal(err)
	}
	run(map[string]string{"github.com": ph, "git.example.org:8443": ph + "ef"})
	file := filepath.Join(tmp, "agent-vm", "gitconfig")
	written, _ := os.Stat(file)
	run(map[string]string{"github.com": ph, "git.example.org:8443": ph + "ef"}) // a second start: nothing changes
	if got := git("", "config", "--system", "--get-all", "include.path"); got != file {
		t.Errorf("include.path = %q, want %s once", got, file)
	}
	if again, err := os.Stat(file); err != nil || !os.SameFile(written, again) {
		t.Errorf("a second start with the same hosts wrote %s again (%v)", file, err)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("%s: %v, %v; want mode 0644", file, fi.Mode(), err)
	}
	if got := git("", "config", "--system", "http.proxy"); got != "http://10.0.2.100:3128" {
		t.Errorf("the proxy's setting after git-https: %q", got)
	}
	// What `git config --add` wrote in the guest before the host rendered it.
	byGit := filepath.Join(tmp, "by-git")
	for _, h := range []struct{ host, ph string }{{"git.example.org:8443", ph + "ef"}, {"github.com", ph}} {
		git("", "config", "--file", byGit, "--add", "url.https://"+h.host+"/.insteadOf", "git@"+h.host+":")
		git("", "config", "--file", byGit, "--add", "url.https://"+h.host+"/.insteadOf", "ssh://git@"+h.host+"/")
		git("", "config", "--file", byGit, "--add", "credential.https://"+h.host+".helper", "")
		git("", "config", "--file", byGit, "--add", "credential.https://"+h.host+".helper",
			`!f() { test "$1" = get && printf 'username=agent-vm\npassword=%s\n' `+h.ph+`; }; f`)
	}
	if ours, theirs := git("", "config", "--file", file, "--list"), git("", "config", "--file", byGit, "--list"); ours != theirs {
		t.Errorf("git reads the rendered configuration as\n%s\nand what git config --add writes as\n%s", ours, theirs)
	}
	if got := git("protocol=https\nhost=git.example.org:8443\npath=o/r.git\n\n", "credential", "fill"); !strings.Contains(got, "password="+ph+"ef") {
		t.Errorf("credential fill for git.example.org:8443:\n%s", got)
	}
	for _, remote := range []string{"git@github.com:o/r.git", "ssh://git@github.com/o/r.git", "https://github.com/o/r.git"} {
		if got := git("", "ls-remote", "--get-url", remote); got != "https://github.com/o/r.git" {
			t.Errorf("%s: git uses %q, want https", remote, got)
		}
	}
	fill := func(host string) string {
		return git("protocol=https\nhost="+host+"\npath=o/r.git\n\n", "credential", "fill")
	}
	if got := fill("github.com"); !strings.Contains(got, "password="+ph+"\n") && !strings.HasSuffix(got, "password="+ph) {
		t.Errorf("credential fill for github.com:\n%s", got)
	}
	// Another host gets no placeholder: fill fails without a prompt.
	if out, _ := cmd("protocol=https\nhost=example.org\n\n", "git", "credential", "fill"); strings.Contains(out, ph) {
		t.Errorf("example.org got the placeholder:\n%s", out)
	}
	run(nil) // a start without a git token: no rewrite, no helper
	if got := git("", "ls-remote", "--get-url", "git@github.com:o/r.git"); got != "git@github.com:o/r.git" {
		t.Errorf("after a start without tokens, git uses %q", got)
	}
}
