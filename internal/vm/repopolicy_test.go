package vm_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/repoconfig"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// repoWithPolicy is a repository whose commit holds policy as its
// .agent-vm/policy.toml.
func repoWithPolicy(t *testing.T, policy string) string {
	repo := tu.Repo(t, true)
	tu.WriteFile(t, filepath.Join(repo, repoconfig.PolicyFile), policy)
	tu.Git(t, repo, "add", ".")
	tu.Git(t, repo, "commit", "--quiet", "-m", "the VMs' network policy")
	return repo
}

// create keeps the repository's policy file in the record, as the
// commit had it; what the agent writes there later changes nothing of it,
// and sync says when its branch changes the file.
func TestCreateKeepsTheRepositoryPolicy(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	repo := repoWithPolicy(t, "allow = [\"pypi.org\"]\nmcp = [\"github\"]\n[secrets]\nGH_TOKEN = [\"api.github.com\"]\n")
	r, err := m.Create(ctx, vm.CreateOptions{Repo: repo, Branch: "feat", Backend: vm.BackendQEMU, MemoryMiB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if r.Net == nil || r.Net.Repo == nil || !slices.Equal(r.Net.Repo.Allow, []string{"pypi.org"}) || r.Net.Repo.File != "feat:"+repoconfig.PolicyFile {
		t.Fatalf("record's net: %+v", r.Net)
	}
	if rp := r.Net.Repo; rp.MCP == nil || !slices.Equal(*rp.MCP, []string{"github"}) || !slices.Equal(rp.Secrets["GH_TOKEN"], []string{"api.github.com"}) {
		t.Errorf("the file's mcp and [secrets] in the record: %+v", rp)
	}
	e, _ := m.Find(ctx, "feat")
	ws := e.Layout.Workspace()
	s, err := m.Sync(ctx, "feat")
	if err != nil || len(s.Warnings) != 0 {
		t.Errorf("sync of the branch as made: %+v, %v; want no warning", s, err)
	}
	// The agent widens its own policy in the workspace and commits it.
	tu.WriteFile(t, filepath.Join(ws, repoconfig.PolicyFile), "allow = [\"pypi.org\", \"*\"]\n")
	tu.Git(t, ws, "commit", "--quiet", "-am", "more network")
	if e, _ = m.Find(ctx, "feat"); !slices.Equal(e.Record.Net.Repo.Allow, []string{"pypi.org"}) {
		t.Errorf("the record's policy after the agent's change: %+v", e.Record.Net.Repo)
	}
	s, err = m.Sync(ctx, "feat")
	if err != nil || len(s.Warnings) != 1 || !strings.Contains(s.Warnings[0], "changes .agent-vm/policy.toml") {
		t.Errorf("sync after the agent's change: %+v, %v; want a warning naming the file", s, err)
	}
}

// A policy file that does not parse refuses create, naming its line, and
// leaves no VM; --ignore-repo-policy makes the VM with the defaults alone.
func TestCreateRefusesABrokenRepositoryPolicy(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	repo := repoWithPolicy(t, "allow = [\n  \"pypi.org\",\n  \"https://x\",\n]\n")
	_, err := m.Create(ctx, vm.CreateOptions{Repo: repo, Branch: "feat", Backend: vm.BackendQEMU, MemoryMiB: 1024})
	if err == nil || !strings.Contains(err.Error(), "feat:.agent-vm/policy.toml:3:") {
		t.Fatalf("got %v, want the file's line", err)
	}
	if entries, _ := m.List(ctx); len(entries) != 0 {
		t.Errorf("VMs after the refusal: %d", len(entries))
	}
	r, err := m.Create(ctx, vm.CreateOptions{Repo: repo, Branch: "feat", Backend: vm.BackendQEMU, MemoryMiB: 1024, IgnoreRepoPolicy: true})
	if err != nil || r.Net != nil {
		t.Errorf("with the file ignored: %+v, %v", r.Net, err)
	}
}
