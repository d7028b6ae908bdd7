package netpolicy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/agent-vm/agent-vm/internal/repoconfig"
	"github.com/agent-vm/agent-vm/internal/state"
)

// FromRepository gives r, a VM being made, its repository's network policy
// (repoconfig.PolicyFile) read from workspace, the new clone of the commit
// the VM starts at: kept in the record, never read from the workspace
// again. A file that does not parse refuses the VM, naming its line;
// ignore (create --ignore-repo-policy) leaves the file unread.
func FromRepository(workspace string, r *state.Record, ignore bool) error {
	if ignore {
		return nil
	}
	p, err := repoconfig.LoadPolicy(workspace, r.Branch+":"+repoconfig.PolicyFile)
	if err != nil {
		return fmt.Errorf("%w (hint: fix it and commit, or create the VM with --ignore-repo-policy for agent-vm's defaults alone)", err)
	}
	if p == nil {
		return nil
	}
	if r.Net == nil {
		r.Net = &state.Net{}
	}
	r.Net.Repo = &state.RepoNet{File: p.Path, Sum: p.Sum, Allow: p.Allow, Deny: p.Deny, Requests: p.Requests, Secrets: p.Secrets, MCP: p.MCP}
	return nil
}

// RepoSecrets is how the repository's policy file narrows the hosts of the
// user's secrets for r's VM (secret.VM.Narrow); nil when it does not.
func RepoSecrets(r *state.Record) map[string][]string {
	if r.Net == nil || r.Net.Repo == nil {
		return nil
	}
	return r.Net.Repo.Secrets
}

// RepoMCP names the host MCP servers the repository's policy file lets mcp
// sync bring into r's VM; nil when it says nothing (all of them).
func RepoMCP(r *state.Record) *[]string {
	if r.Net == nil || r.Net.Repo == nil {
		return nil
	}
	return r.Net.Repo.MCP
}

// FileReader reads a file of a commit of the user's repository (gitws's
// ReadAt): found is false when the commit has none.
type FileReader interface {
	ReadAt(ctx context.Context, repo, rev, path string, limit int64) (raw []byte, found bool, err error)
}

// PolicyDrift says, for sync, whether the commit rev of the user's
// repository (the VM's branch as synced) has another policy file than the
// one r was made with: a warning to read before merging it, since VMs made
// from it would take it; "" when it has the same.
func PolicyDrift(ctx context.Context, git FileReader, r *state.Record, repo, rev string) string {
	raw, found, err := git.ReadAt(ctx, repo, rev, repoconfig.PolicyFile, 1<<20)
	if err != nil {
		return ""
	}
	had := ""
	if r.Net != nil && r.Net.Repo != nil {
		had = r.Net.Repo.Sum
	}
	now := ""
	if found {
		sum := sha256.Sum256(raw)
		now = hex.EncodeToString(sum[:])
	}
	switch {
	case now == had:
		return ""
	case had == "":
		return fmt.Sprintf("the VM's branch adds %s: review it before you merge (VMs made from it follow it; this VM keeps the policy it was made with)", repoconfig.PolicyFile)
	case now == "":
		return fmt.Sprintf("the VM's branch removes %s: review it before you merge (this VM keeps the policy it was made with)", repoconfig.PolicyFile)
	}
	return fmt.Sprintf("the VM's branch changes %s: review it before you merge (`git log -p %s -- %s` shows how; VMs made from it follow it; this VM keeps the policy it was made with)", repoconfig.PolicyFile, short(rev), repoconfig.PolicyFile)
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}
