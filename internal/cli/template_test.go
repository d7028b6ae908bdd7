package cli

import (
	"strings"
	"testing"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestTemplateRefusals: template's verbs refuse what they cannot do,
// naming the input and the way out; list says there is none.
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
	r := agentVMEnv(t, repo, st, env, "template", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "no templates") {
		t.Errorf("template list: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
}
