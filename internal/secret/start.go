package secret

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/agent-vm/agent-vm/internal/credswap"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/gitws"
)

// A VM's secrets stay on the host: a start gives the guest a placeholder
// for each secret in the VM's scope, and the VM's egress proxy the values,
// through a pipe (egress.Bundle), to put in place of the placeholders on
// requests to the secrets' hosts.

// VM is what a start of a contained VM knows that its secrets need.
type VM struct {
	// Kept are the placeholders the VM's record keeps from its last start,
	// by name: a secret keeps its placeholder from start to start.
	Kept map[string]string
	// CACert and CAKey are the VM's proxy CA (PEM), which the guest trusts.
	CACert, CAKey []byte
	// Branch is the VM's branch, and Upstream its workspace's upstream
	// URL: a push may update that branch of that repository alone.
	Branch, Upstream string
	// Narrow is the repository's policy file's [secrets]: a secret it
	// names is bound to those of its hosts it lists, and to none when it
	// lists none of them. It never adds a host: the file is whoever pushed
	// it's, the binding the user's.
	Narrow map[string][]string
}

// Start is what a start of a contained VM hands its guest and its proxy.
type Start struct {
	CACert string // PEM: the VM's CA, which the guest trusts
	// Placeholders are the guest's environment, by name, and Hosts the
	// hosts the secrets are bound to, sorted: the record keeps both.
	Placeholders map[string]string
	Hosts        []string
	// GitCredentials: the upstream's host, when a secret is bound to it,
	// and that secret's placeholder, which the guest's git answers.
	GitCredentials map[string]string
	Bundle         []byte // the proxy's standard input; nil: no secret
}

// Changed reports whether the record's placeholders or bound hosts
// (placeholders, hosts) differ from s's, so the record is to be written.
func (s *Start) Changed(placeholders map[string]string, hosts []string) bool {
	return !maps.Equal(s.Placeholders, placeholders) || !slices.Equal(s.Hosts, hosts)
}

// ForStart gathers what a start of v gives its VM: scope's secrets (the
// store's for every VM and for this one, For), then extra (the start's
// own, which scope's of the same name win over).
func ForStart(v VM, scope, extra []Secret) (*Start, error) {
	for _, s := range extra {
		if !slices.ContainsFunc(scope, func(x Secret) bool { return x.Name == s.Name }) {
			scope = append(scope, s)
		}
	}
	out := &Start{CACert: string(v.CACert), Placeholders: map[string]string{}}
	var bound []credswap.Secret
	for _, s := range scope {
		if only, ok := v.Narrow[s.Name]; ok {
			s.Hosts = slices.DeleteFunc(slices.Clone(s.Hosts), func(h string) bool { return !slices.Contains(only, h) })
		}
		p := v.Kept[s.Name]
		if p == "" {
			p = Placeholder()
		}
		out.Placeholders[s.Name] = p
		bound = append(bound, credswap.Secret{Name: s.Name, Placeholder: p, Value: s.Value.Reveal(), Hosts: s.Hosts, Headers: s.Carriers()})
		out.Hosts = append(out.Hosts, s.Hosts...)
	}
	slices.Sort(out.Hosts)
	out.Hosts = slices.Compact(out.Hosts)
	if len(bound) == 0 {
		return out, nil
	}
	b := egress.Bundle{CACert: string(v.CACert), CAKey: string(v.CAKey), Secrets: bound}
	// A push may update the VM's branch of the workspace's upstream
	// repository alone; with no upstream known, no push goes through.
	if up, ok := gitws.ParseRemote(v.Upstream); ok {
		b.Branch, b.Repo = v.Branch, up.Path
		for _, s := range bound {
			if slices.Contains(s.Hosts, up.Host) {
				out.GitCredentials = map[string]string{up.Host: s.Placeholder}
				break
			}
		}
	}
	var err error
	if out.Bundle, err = json.Marshal(b); err != nil {
		return nil, err
	}
	return out, nil
}
