package vm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/credswap"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/secret"
	"github.com/agent-vm/agent-vm/internal/state"
)

// A VM's secrets stay on the host (internal/secret): a start gives the
// guest a placeholder for each secret in the VM's scope, and the VM's
// egress proxy the values, through a pipe (egress.Bundle), to put in
// place of the placeholders on requests to the secrets' hosts.

// startSecrets is what a start of a contained VM hands its guest and its
// proxy.
type startSecrets struct {
	caCert       string            // PEM: the VM's CA, which the guest trusts
	placeholders map[string]string // by name: the guest's environment
	// gitCredentials: the upstream's host, when a secret is bound to it,
	// and that secret's placeholder, which the guest's git answers.
	gitCredentials map[string]string
	bundle         []byte // the proxy's standard input; nil: no secret
}

// secretsFor gathers the secrets a start of e gives its VM: the store's
// for every VM and for this one, then extra (the start's own, which the
// store's of the same name win over). It makes the VM's CA if the VM
// lacks one (made before agent-vm had them) and keeps each secret's
// placeholder in the record from start to start.
func (m *Manager) secretsFor(e state.Entry, extra []secret.Secret) (*startSecrets, error) {
	r, l := e.Record, e.Layout
	cert, key, err := proxyCA(l, r.Slug)
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
	for _, s := range extra {
		if !slices.ContainsFunc(scope, func(x secret.Secret) bool { return x.Name == s.Name }) {
			scope = append(scope, s)
		}
	}
	out := &startSecrets{caCert: string(cert), placeholders: map[string]string{}}
	var bound []credswap.Secret
	for _, s := range scope {
		p := r.Placeholders[s.Name]
		if p == "" {
			p = secret.Placeholder()
		}
		out.placeholders[s.Name] = p
		bound = append(bound, credswap.Secret{Name: s.Name, Placeholder: p, Value: s.Value.Reveal(), Hosts: s.Hosts, Headers: s.Carriers()})
	}
	var hosts []string
	for _, s := range scope {
		hosts = append(hosts, s.Hosts...)
	}
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	if !maps.Equal(out.placeholders, r.Placeholders) || !slices.Equal(hosts, r.SecretHosts) {
		r.Placeholders, r.SecretHosts = out.placeholders, hosts
		if len(r.Placeholders) == 0 {
			r.Placeholders = nil
		}
		if err := state.WriteRecord(l.Record(), r); err != nil {
			return nil, err
		}
	}
	if len(bound) == 0 {
		return out, nil
	}
	b := egress.Bundle{CACert: string(cert), CAKey: string(key), Secrets: bound}
	// A push may update the VM's branch of the workspace's upstream
	// repository alone; with no upstream known, no push goes through.
	if up, ok := gitws.ParseRemote(r.Git.UpstreamURL); ok {
		b.Branch, b.Repo = r.Branch, up.Path
		for _, s := range bound {
			if slices.Contains(s.Hosts, up.Host) {
				out.gitCredentials = map[string]string{up.Host: s.Placeholder}
				break
			}
		}
	}
	if out.bundle, err = json.Marshal(b); err != nil {
		return nil, err
	}
	return out, nil
}

// proxyCA returns the VM's CA (certificate and key, PEM), made on first
// use: at create, or at the first start of a VM made before.
func proxyCA(l state.Layout, slug string) (cert, key []byte, err error) {
	cert, cerr := os.ReadFile(l.ProxyCA())
	key, kerr := os.ReadFile(l.ProxyCAKey())
	switch {
	case cerr == nil && kerr == nil:
		return cert, key, nil
	case !errors.Is(cerr, fs.ErrNotExist) && cerr != nil:
		return nil, nil, fmt.Errorf("the VM's proxy CA: %w", cerr)
	case !errors.Is(kerr, fs.ErrNotExist) && kerr != nil:
		return nil, nil, fmt.Errorf("the VM's proxy CA: %w", kerr)
	}
	if cert, key, err = egress.NewCA(slug); err != nil {
		return nil, nil, fmt.Errorf("making the VM's proxy CA: %w", err)
	}
	// The key first: a certificate without its key is made afresh.
	if err := atomicfile.Write(l.ProxyCAKey(), key, 0o600); err != nil {
		return nil, nil, err
	}
	if err := atomicfile.Write(l.ProxyCA(), cert, 0o600); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}
