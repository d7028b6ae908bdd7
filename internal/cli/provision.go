package cli

import (
	"context"
	"maps"
	"slices"

	"github.com/agent-vm/agent-vm/internal/agent"
	"github.com/agent-vm/agent-vm/internal/browser"
	"github.com/agent-vm/agent-vm/internal/secret"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/wire"
)

// runProvisioner is run's agent.Provisioner: the Manager's Create and
// Start with run's create and start flags, and the browser room's
// ForAgent for --chrome.
type runProvisioner struct {
	m      *vm.Manager
	create vm.CreateOptions
	start  vm.StartOptions
	getenv func(string) string
	// notify tells the user a line (the template hint after a start, what
	// ForAgent says).
	notify func(string)
	// schedule, when set, sets run --checkpoint-every's schedule once the
	// VM runs.
	schedule func(ctx context.Context, vm string) error
}

var _ agent.Provisioner = (*runProvisioner)(nil)

func (r *runProvisioner) Create(ctx context.Context, branch, install string) (agent.VM, error) {
	co := r.create
	co.Branch, co.Agent = branch, install
	rec, err := r.m.Create(ctx, co)
	if err != nil {
		return agent.VM{}, err
	}
	return agent.VM{Slug: rec.Slug, Branch: rec.Branch, Agent: rec.Agent}, nil
}

func (r *runProvisioner) Start(ctx context.Context, name string, keys map[string]string) (agent.VM, bool, error) {
	so := r.start
	so.Secrets = slices.Clone(so.Secrets)
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		s, err := secret.FromEnv(k, keys[k])
		if err != nil {
			return agent.VM{}, false, err
		}
		so.Secrets = append(so.Secrets, s)
	}
	sr, err := r.m.Start(ctx, name, so)
	if err != nil {
		return agent.VM{}, false, err
	}
	if hint := wire.Templates(r.m).Hint(sr.NoTemplateYet, sr.SSHReady); hint != "" {
		r.notify(hint)
	}
	if r.schedule != nil {
		if err := r.schedule(ctx, name); err != nil {
			return agent.VM{}, false, err
		}
	}
	i := sr.Info // its status: the record's backend, secrets and network
	return agent.VM{Slug: i.Slug, Branch: i.Branch, Backend: i.Backend, Contained: i.Net != nil && i.Net.Uncontained == "",
		Secrets: i.Secrets}, !sr.AlreadyRunning, nil
}

func (r *runProvisioner) OpenBrowser(ctx context.Context, vmName string) (bool, error) {
	return browser.ForAgent(ctx, r.m, vmName, r.getenv, r.notify)
}
