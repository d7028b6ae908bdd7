package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestTemplateRefusals: template's verbs (and setup --template) refuse
// what they cannot do, naming the input and the way out, before anything
// is made; list says there is none.
func TestTemplateRefusals(t *testing.T) {
	repo := tu.Repo(t, true)
	st := t.TempDir()
	env := map[string]string{"XDG_CACHE_HOME": t.TempDir()}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"template", "rm"}, []string{"one template name", "template list"}},
		{[]string{"template", "rm", "t-nosuch"}, []string{`no template "t-nosuch"`, "template list"}},
		{[]string{"template", "build", "no-such-branch"}, []string{"no-such-branch"}},
		{[]string{"template", "build", "a", "b"}, []string{"at most one BRANCH"}},
		{[]string{"template", "build", "--agents", "clippy"}, []string{`"clippy" is not an agent`, "claude,codex,gemini"}},
		{[]string{"template", "build", "--agents", "claude@^2"}, []string{`"^2" is not a version of claude`, "latest"}},
		{[]string{"template", "build", "--agents", "codex,codex"}, []string{"names codex twice"}},
		{[]string{"setup", "--agents", "claude"}, []string{"goes with --template"}},
		{[]string{"setup", "--template", "--agents", "clippy"}, []string{`"clippy" is not an agent`}},
	} {
		r := agentVMEnv(t, repo, st, env, tc.args...)
		if r.code == 0 {
			t.Errorf("agent-vm %s: exit 0, want a refusal", strings.Join(tc.args, " "))
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("agent-vm %s: stderr %q lacks %q", strings.Join(tc.args, " "), r.stderr, w)
			}
		}
	}
	_ = filepath.WalkDir(env["XDG_CACHE_HOME"], func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && strings.HasPrefix(d.Name(), "t-") {
			t.Errorf("a refusal made a template directory: %s", p)
		}
		return nil
	})
	r := agentVMEnv(t, repo, st, env, "template", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "no templates") {
		t.Errorf("template list: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
}
