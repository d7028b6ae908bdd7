package vm

import (
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/secret"
	"github.com/agent-vm/agent-vm/internal/state"
)

// secretsFor gathers the secrets a start of e gives its VM
// (secret.ForStart): the store's for every VM and for this one, then extra
// (the start's own). It makes the VM's CA if the VM lacks one (made before
// agent-vm had them) and keeps each secret's placeholder in the record
// from start to start.
func (m *Manager) secretsFor(e state.Entry, extra []secret.Secret) (*secret.Start, error) {
	r, l := e.Record, e.Layout
	cert, key, err := egress.CAFiles(l.ProxyCA(), l.ProxyCAKey(), r.Slug)
	if err != nil {
		return nil, err
	}
	var scope []secret.Secret
	if st := m.Secrets; st != nil {
		all, err := st.List()
		if err != nil {
			return nil, err
		}
		scope = secret.For(all, r.ID)
	}
	s, err := secret.ForStart(secret.VM{Kept: r.Placeholders, CACert: cert, CAKey: key, Branch: r.Branch, Upstream: r.Git.UpstreamURL,
		Narrow: netpolicy.RepoSecrets(r)}, scope, extra)
	if err != nil {
		return nil, err
	}
	if s.Changed(r.Placeholders, r.SecretHosts) {
		r.Placeholders, r.SecretHosts = s.Placeholders, s.Hosts
		if len(r.Placeholders) == 0 {
			r.Placeholders = nil
		}
		if err := state.WriteRecord(l.Record(), r); err != nil {
			return nil, err
		}
	}
	return s, nil
}
