package secret

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/egress"
)

// The repository's [secrets] narrows a secret to those of its hosts it
// lists, never adds one (evil.example), binds one it lists none of to no
// host, and leaves the secrets it does not name as the user bound them.
func TestForStartNarrows(t *testing.T) {
	secret := func(name string, hosts ...string) Secret {
		v, err := ReadValue(strings.NewReader("value-of-" + name))
		if err != nil {
			t.Fatal(err)
		}
		return Secret{Name: name, Hosts: hosts, Value: v}
	}
	scope := []Secret{secret("GH_TOKEN", "github.com", "api.github.com"), secret("NPM_TOKEN", "registry.npmjs.org"), secret("OTHER", "other.example")}
	v := VM{CACert: []byte("cert"), CAKey: []byte("key"), Branch: "feat",
		Narrow: map[string][]string{"GH_TOKEN": {"api.github.com", "evil.example"}, "NPM_TOKEN": {}}}
	s, err := ForStart(v, scope, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Hosts, []string{"api.github.com", "other.example"}) {
		t.Errorf("the hosts the VM may reach for its secrets: %q", s.Hosts)
	}
	var b egress.Bundle
	if err := json.Unmarshal(s.Bundle, &b); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, x := range b.Secrets {
		got[x.Name] = x.Hosts
	}
	if !slices.Equal(got["GH_TOKEN"], []string{"api.github.com"}) || len(got["NPM_TOKEN"]) != 0 || !slices.Equal(got["OTHER"], []string{"other.example"}) {
		t.Errorf("the proxy's bindings: %q", got)
	}
	if !slices.Equal(scope[0].Hosts, []string{"github.com", "api.github.com"}) {
		t.Errorf("the user's secret was changed: %q", scope[0].Hosts)
	}
	if len(s.Placeholders) != 3 {
		t.Errorf("placeholders: %v", s.Placeholders)
	}
}
