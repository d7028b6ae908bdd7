package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// SyncResult says what Sync did: the VM's branch as it now is in the
// repository the VM was created from.
type SyncResult = gitws.SyncResult

// Sync fetches the VM's branch from its workspace into the repository the
// VM was created from, as gitws.SyncRefs + the branch (see gitws.Sync:
// nothing of the workspace's runs on the host). It reads only the host's
// copy of the workspace, so the VM may be running or stopped, and takes no
// lock: a fetch is one ref update in the user's repository, and an agent
// committing meanwhile is fetched now or next time.
func (m *Manager) Sync(ctx context.Context, name string) (*SyncResult, error) {
	e, err := m.Recorded(ctx, name)
	if err != nil {
		return nil, err
	}
	r := e.Record
	ws, src, branch := e.Layout.Workspace(), r.Git.Source, r.Branch
	if s, err := m.siteOf(e); err != nil {
		return nil, err
	} else if s != nil {
		if _, err := os.Lstat(filepath.Join(src, ".git")); src == "" || err != nil {
			return nil, fmt.Errorf("the repository VM %q was created from (%s) is gone, so there is nowhere to sync to (hint: put a clone of it back there, then sync again)", branch, termsafe.String(src))
		}
		res, err := s.Sync(ctx, src, branch)
		if err != nil {
			return nil, fmt.Errorf("syncing VM %q from host %s: %w", branch, s.Host(), err)
		}
		return m.policyDrift(ctx, e.Record, res), nil
	}
	if _, err := os.Lstat(ws); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("VM %q has no workspace any more (%s is gone), so there is nothing to sync (hint: `agent-vm destroy %s` removes the VM)", branch, ws, e.Slug)
	}
	if !gitws.IsRepo(ws) {
		return nil, fmt.Errorf("the workspace %s of VM %q is not a git repository (no .git directory of its own), so agent-vm cannot fetch from it (hint: copy what you need out of it by hand)", ws, branch)
	}
	if _, err := os.Lstat(filepath.Join(src, ".git")); src == "" || err != nil {
		return nil, fmt.Errorf("the repository VM %q was created from (%s) is gone, so there is nowhere to sync to (hint: put a clone of it back there, then sync again)", branch, termsafe.String(src))
	}
	res, err := m.Git.Sync(ctx, ws, src, branch)
	if err != nil {
		return nil, fmt.Errorf("syncing VM %q: %w", branch, err)
	}
	return m.policyDrift(ctx, r, res), nil
}

// policyDrift adds to res a warning when the synced branch has another
// network policy file than r was made with (netpolicy.PolicyDrift).
func (m *Manager) policyDrift(ctx context.Context, r *state.Record, res *SyncResult) *SyncResult {
	if w := netpolicy.PolicyDrift(ctx, m.Git, r, r.Git.Source, res.New); w != "" {
		res.Warnings = append(res.Warnings, w)
	}
	return res
}
