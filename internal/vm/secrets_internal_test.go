package vm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/secret"
	"github.com/agent-vm/agent-vm/internal/state"
)

// TestSecretsFor: a start gets the store's secrets for every VM and for
// this one, its own after them; placeholders are kept from start to
// start in the record, which holds no value; the proxy's bundle holds the
// values and the VM's CA, made 0600 on first use.
func TestSecretsFor(t *testing.T) {
	store := &secret.Store{Dir: hostdir.Top(t.TempDir(), 0o700, hostdir.InXDG).Sub("secrets", 0o700)}
	value := func(v string) secret.Value {
		x, err := secret.ReadValue(strings.NewReader(v))
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	for _, s := range []secret.Secret{
		{Name: "GH_TOKEN", Hosts: []string{"github.com"}, Value: value("canary-gh")},
		{Name: "MINE", Hosts: []string{"example.com"}, VM: "id-1", Value: value("canary-mine")},
		{Name: "OTHERS", Hosts: []string{"example.com"}, VM: "id-2", Value: value("canary-others")},
	} {
		if err := store.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	l := state.Layout{Dir: t.TempDir()}
	if err := l.MakeDirs(); err != nil {
		t.Fatal(err)
	}
	r := &state.Record{Version: state.RecordVersion, ID: "id-1", Branch: "feat/x", Slug: "feat-x",
		Ports: state.Ports{SSH: 2222, MCP: 8080}, Git: state.Git{UpstreamURL: "git@github.com:o/r.git"}}
	if err := state.WriteRecord(l.Record(), r); err != nil {
		t.Fatal(err)
	}
	m := &Manager{Secrets: store}
	e := state.Entry{Slug: r.Slug, Layout: l, Record: r}
	extra := []secret.Secret{
		{Name: "GH_TOKEN", Hosts: []string{"github.com"}, Value: value("canary-env-loses")},
		{Name: "ANTHROPIC_API_KEY", Hosts: []string{"api.anthropic.com"}, Value: value("canary-env")},
	}
	s1, err := m.secretsFor(e, extra)
	if err != nil {
		t.Fatal(err)
	}
	if len(s1.Placeholders) != 3 || s1.Placeholders["OTHERS"] != "" {
		t.Errorf("placeholders %v, want GH_TOKEN, MINE, ANTHROPIC_API_KEY", s1.Placeholders)
	}
	for name, p := range s1.Placeholders {
		if !strings.HasPrefix(p, secret.PlaceholderPrefix) {
			t.Errorf("%s's placeholder %q", name, p)
		}
	}
	var b egress.Bundle
	if err := json.Unmarshal(s1.Bundle, &b); err != nil {
		t.Fatal(err)
	}
	values := map[string]string{}
	for _, s := range b.Secrets {
		values[s.Name] = s.Value
		if s.Placeholder != s1.Placeholders[s.Name] {
			t.Errorf("%s: the proxy's placeholder is not the guest's", s.Name)
		}
	}
	if values["GH_TOKEN"] != "canary-gh" || values["MINE"] != "canary-mine" || values["ANTHROPIC_API_KEY"] != "canary-env" || len(values) != 3 {
		t.Errorf("the bundle's values are not the store's, then the start's own")
	}
	if b.Branch != "feat/x" || b.Repo != "/o/r" || b.CACert != s1.CACert || !strings.Contains(b.CAKey, "PRIVATE KEY") {
		t.Errorf("bundle: branch %q repo %q", b.Branch, b.Repo)
	}
	if got := strings.Join(r.SecretHosts, " "); got != "api.anthropic.com example.com github.com" {
		t.Errorf("the record's secret hosts %q", got)
	}
	if g := s1.GitCredentials; len(g) != 1 || g["github.com"] != s1.Placeholders["GH_TOKEN"] {
		t.Errorf("git credentials %v, want github.com with GH_TOKEN's placeholder", g)
	}
	if _, err := egress.ReadBundle(strings.NewReader(string(s1.Bundle)), ""); err != nil {
		t.Errorf("the proxy cannot read the bundle: %v", err)
	}
	for _, f := range []string{l.ProxyCA(), l.ProxyCAKey()} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, want mode 0600", f, err)
		}
	}
	// Nothing of a value in the VM's directory.
	_ = filepath.WalkDir(l.Dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if raw, _ := os.ReadFile(p); strings.Contains(string(raw), "canary") {
				t.Errorf("%s holds a secret's value", p)
			}
		}
		return nil
	})

	// The next start: the same placeholders and CA; a start without the
	// run's own secret drops its placeholder.
	got, err := state.ReadRecord(l.Record())
	if err != nil {
		t.Fatal(err)
	}
	e.Record = got
	s2, err := m.secretsFor(e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s2.CACert != s1.CACert || s2.Placeholders["GH_TOKEN"] != s1.Placeholders["GH_TOKEN"] || s2.Placeholders["MINE"] != s1.Placeholders["MINE"] {
		t.Errorf("a second start changed the CA or the placeholders")
	}
	if _, ok := s2.Placeholders["ANTHROPIC_API_KEY"]; ok || len(got.Placeholders) != 2 {
		t.Errorf("the run's own secret outlived its start: %v", got.Placeholders)
	}

	// No secret: the CA still, no bundle.
	empty := &Manager{}
	s3, err := empty.secretsFor(e, nil)
	if err != nil || s3.Bundle != nil || s3.CACert != s1.CACert || len(e.Record.Placeholders) != 0 {
		t.Errorf("no secrets: %v, bundle %d bytes, placeholders %v", err, len(s3.Bundle), e.Record.Placeholders)
	}
}
