package netpolicy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/repoconfig"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// The repository's policy file joins the proxy's policy between the
// defaults and the user's own: its allows and refusals (a refusal the user
// allowed since is lifted) and its request rules after the user's, before
// the defaults; net show marks each rule's source.
func TestPolicyWithTheRepositorysFile(t *testing.T) {
	ws := t.TempDir()
	tu.WriteFile(t, filepath.Join(ws, repoconfig.PolicyFile),
		"allow = [\"pypi.org\"]\ndeny = [\"telemetry.example.com\", \"ads.example.com\"]\nrequests = [\"deny POST api.github.com/repos/o/r/issues\"]\n")
	r := &state.Record{Branch: "feat", Slug: "feat", Git: state.Git{UpstreamURL: "https://github.com/o/r"},
		SecretHosts: []string{"api.github.com"}}
	if err := FromRepository(ws, r, false); err != nil {
		t.Fatal(err)
	}
	if r.Net == nil || r.Net.Repo == nil || r.Net.Repo.File != "feat:"+repoconfig.PolicyFile || len(r.Net.Repo.Sum) != 64 {
		t.Fatalf("record's net: %+v", r.Net)
	}
	r.Net.Allow = []string{"ads.example.com"} // the user's net allow, since
	r.Net.Requests = []string{"allow POST api.github.com/repos/o/r/issues"}
	p := Policy(r, nil)
	if !slices.Contains(p.Allow, "pypi.org") || !slices.Equal(p.Deny, []string{"telemetry.example.com"}) {
		t.Errorf("allow %q, deny %q: want pypi.org allowed, only telemetry refused", p.Allow, p.Deny)
	}
	var rules []string
	for _, rule := range p.Requests[:3] {
		rules = append(rules, rule.String())
	}
	if !slices.Equal(rules, []string{"allow POST api.github.com/repos/o/r/issues", "deny POST api.github.com/repos/o/r/issues", "allow POST api.github.com/graphql graphql:createPullRequest,addComment"}) {
		t.Errorf("request rules begin %q: want the user's, the repository's, then the defaults", rules)
	}
	info := requestInfo(r)
	if info[0].Repository || !info[1].Repository || info[1].Default || !info[2].Default {
		t.Errorf("request rules' sources: %+v", info[:3])
	}
	if _, err := egress.ParseRequestRule(info[1].Rule); err != nil {
		t.Error(err)
	}
	// [secrets] and mcp: what net show says of them.
	mcp := []string{"github"}
	r.Net.Repo.Secrets, r.Net.Repo.MCP = map[string][]string{"NPM_TOKEN": {}, "GH_TOKEN": {"api.github.com"}}, &mcp
	if n := InfoOf(state.Entry{Record: r}, true, nil).Narrowed; !slices.Equal(n, []string{
		"secret GH_TOKEN: only to api.github.com, of the hosts you bound it to",
		"secret NPM_TOKEN: only to no host, of the hosts you bound it to",
		"mcp sync: only the host's MCP servers github"}) || RepoMCP(r) != &mcp || RepoSecrets(r)["GH_TOKEN"][0] != "api.github.com" {
		t.Errorf("narrowed: %q", n)
	}
}

// A broken file refuses the VM naming its line, unless it is ignored; no
// file leaves the record's policy alone.
func TestFromRepositoryRefusesABrokenFile(t *testing.T) {
	ws := t.TempDir()
	r := &state.Record{Branch: "feat"}
	if err := FromRepository(ws, r, false); err != nil || r.Net != nil {
		t.Errorf("no file: %v, %+v", err, r.Net)
	}
	tu.WriteFile(t, filepath.Join(ws, repoconfig.PolicyFile), "allow = [\n  \"ok.example\",\n  \"not a host\",\n]\n")
	err := FromRepository(ws, r, false)
	if err == nil || !strings.Contains(err.Error(), "feat:.agent-vm/policy.toml:3:") || !strings.Contains(err.Error(), "--ignore-repo-policy") {
		t.Errorf("a broken file: %v, want its line and the way around", err)
	}
	if err := FromRepository(ws, r, true); err != nil || r.Net != nil {
		t.Errorf("ignored: %v, %+v", err, r.Net)
	}
}

// sync's warning: a branch that adds, changes or removes the file is
// named; one that keeps it is not. Real git reads the commits.
func TestPolicyDrift(t *testing.T) {
	ctx := context.Background()
	repo := tu.Repo(t, false)
	g := gitws.New(execx.OS{})
	commit := func(content string) string {
		if content == "" {
			tu.Git(t, repo, "rm", "--quiet", repoconfig.PolicyFile)
		} else {
			tu.WriteFile(t, filepath.Join(repo, repoconfig.PolicyFile), content)
			tu.Git(t, repo, "add", repoconfig.PolicyFile)
		}
		tu.Git(t, repo, "commit", "--quiet", "-m", "policy")
		return tu.Git(t, repo, "rev-parse", "HEAD")
	}
	none := tu.Git(t, repo, "rev-parse", "HEAD")
	r := &state.Record{Branch: "main"}
	if w := PolicyDrift(ctx, g, r, repo, none); w != "" {
		t.Errorf("no file then or now: %q", w)
	}
	first := commit("allow = [\"a.example\"]\n")
	if w := PolicyDrift(ctx, g, r, repo, first); !strings.Contains(w, "adds .agent-vm/policy.toml") {
		t.Errorf("added: %q", w)
	}
	if err := FromRepository(repoAt(t, repo), r, false); err != nil {
		t.Fatal(err)
	}
	if w := PolicyDrift(ctx, g, r, repo, first); w != "" {
		t.Errorf("the same file: %q", w)
	}
	second := commit("allow = [\"a.example\", \"b.example\"]\n")
	if w := PolicyDrift(ctx, g, r, repo, second); !strings.Contains(w, "changes .agent-vm/policy.toml") || !strings.Contains(w, "git log -p") {
		t.Errorf("changed: %q", w)
	}
	if w := PolicyDrift(ctx, g, r, repo, commit("")); !strings.Contains(w, "removes") {
		t.Errorf("removed: %q", w)
	}
}

// repoAt is a copy of repo's work tree as it is: a workspace.
func repoAt(t *testing.T, repo string) string {
	t.Helper()
	ws := filepath.Join(t.TempDir(), "ws")
	tu.Git(t, filepath.Dir(ws), "clone", "--quiet", repo, ws)
	if _, err := os.Stat(filepath.Join(ws, repoconfig.PolicyFile)); err != nil {
		t.Fatal(err)
	}
	return ws
}
