package vm

import (
	"context"
	"fmt"
	"time"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/repoconfig"
	"github.com/agent-vm/agent-vm/internal/state"
)

// applyRepoConfig reads the repository's .agent-vm/policy.toml
// (netpolicy.FromRepository) and .agent-vm/config.toml from the new
// workspace l (the branch's commit): the policy and the packages join the
// record, and the config's defaults fill the create flags the user left
// unset, each checked as the flag would be, with errors naming the file
// (and, for packages and the policy, the line).
func (m *Manager) applyRepoConfig(o CreateOptions, l state.Layout, rec *state.Record, be backend.Backend) error {
	if err := netpolicy.FromRepository(l.Workspace(), rec, o.IgnoreRepoPolicy); err != nil {
		return err
	}
	// The workspace is still in the staging directory: name the file as
	// git does, branch:path.
	c, err := repoconfig.Load(l.Workspace(), rec.Branch+":"+guest.ConfigFile)
	if err != nil {
		return err
	}
	if c.Path == "" {
		return nil
	}
	if err := checkRepoPackages(c, be); err != nil {
		return err
	}
	rec.RepoPackages, rec.IdleSuspend = c.Packages, c.IdleSuspend
	d := o
	if d.CPUs == 0 {
		d.CPUs = c.CPUs
	}
	if d.MemoryMiB == 0 {
		d.MemoryMiB = c.MemoryMiB
	}
	if d.Agent == "" && c.Agent != "" {
		if err := be.CheckCreate(backend.CreateFlags{Agent: c.Agent}); err != nil {
			m.Log.Warn("not installing the agent the repository's config.toml names", "file", c.Path, "reason", err)
		} else {
			d.Agent = c.Agent
		}
	}
	if err := checkCreateFlags(d, m.Size()); err != nil {
		return fmt.Errorf("%s sets a default that does not fit: %w", c.Path, err)
	}
	if d.CPUs != 0 {
		rec.Resources.CPUs = d.CPUs
	}
	if d.MemoryMiB != 0 {
		rec.Resources.MemoryMiB = d.MemoryMiB
	}
	rec.Agent = d.Agent
	return nil
}

// checkRepoPackages checks each of the file's packages against the
// backend's grammar, naming the file and line of the first bad one.
func checkRepoPackages(c *repoconfig.Config, be backend.Backend) error {
	for _, p := range c.Packages {
		if err := be.CheckCreate(backend.CreateFlags{Packages: []string{p}}); err != nil {
			return fmt.Errorf("%s:%d: %w", c.Path, c.Line("packages", p), err)
		}
	}
	return nil
}

// checkProvision asks the guest how its provisioning went
// (guestctl.CheckProvision); a failure gets what the VM's egress proxy
// refused since the boot began (since), with the fixes.
func (m *Manager) checkProvision(ctx context.Context, e state.Entry, since time.Time) error {
	r, l := e.Record, e.Layout
	c, err := m.dialGuest(ctx, r, l)
	if err != nil {
		m.Log.Warn("could not ask the guest how its provisioning went", "error", err)
		return nil
	}
	defer c.Close()
	return netpolicy.WithRefusals(ctx, m, e, r.Slug, since, guestctl.CheckProvision(ctx, c, r.Branch, r.Slug, m.Log))
}
