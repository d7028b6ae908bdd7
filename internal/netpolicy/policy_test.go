package netpolicy

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/state"
)

// The host of every form of git remote a workspace can have; none for
// local paths and for what is no host name.
func TestRemoteHost(t *testing.T) {
	for u, want := range map[string]string{
		"https://github.com/o/r.git":       "github.com",
		"https://user@GitLab.example.com/": "gitlab.example.com",
		"ssh://git@git.example.org:2222/r": "git.example.org",
		"git@github.com:o/r.git":           "github.com",
		"/home/u/src/repo":                 "",
		"file:///home/u/src/repo":          "",
		"":                                 "",
		"../sibling":                       "",
		"https://exa mple.com/r":           "",
	} {
		if got := remoteHost(u); got != want {
			t.Errorf("remoteHost(%q) = %q, want %q", u, got, want)
		}
	}
}

// The proxy's policy: the default allow-list, the remotes' hosts, the
// user's additions (each once) and refusals, the exposed ports sorted and
// each once; a record without a policy is mode allow.
func TestPolicy(t *testing.T) {
	r := &state.Record{Slug: "feat-x",
		Git:         state.Git{UpstreamURL: "git@git.example.org:o/r.git", OriginURL: "https://github.com/o/r"},
		Net:         &state.Net{Mode: egress.ModeOpen, Allow: []string{"*.example.com", "github.com"}, Deny: []string{"bad.example.com"}},
		Exposed:     []state.Exposed{{Port: 9000}, {Port: 5432}, {Port: 9000, By: state.ExposedByMCPSync}},
		SecretHosts: []string{"api.example.net", "git.example.org"},
	}
	p := Policy(r, nil)
	want := append(slices.Clone(egress.DefaultAllow), "git.example.org", "api.example.net")
	if !slices.Contains(egress.DefaultAllow, "github.com") {
		want = append(want, "github.com")
	}
	want = append(want, "*.example.com")
	if p.Branch != "feat-x" || p.Mode != egress.ModeOpen || !reflect.DeepEqual(p.Allow, want) ||
		!reflect.DeepEqual(p.Deny, []string{"bad.example.com"}) || !reflect.DeepEqual(p.Exposed, []int{5432, 9000}) {
		t.Errorf("Policy = %+v\nwant allow %v, deny [bad.example.com], exposed [5432 9000], mode open", p, want)
	}
	if m := ModeOf(&state.Record{}); m != egress.ModeAllow {
		t.Errorf("a record without a policy has mode %q, want allow", m)
	}
}

// Write makes the network directory 0700 and a policy the proxy reads
// back as Policy made it; writing again replaces it.
func TestWriteIsWhatTheProxyReads(t *testing.T) {
	l := state.Layout{Dir: t.TempDir()}
	r := &state.Record{Slug: "v", Net: &state.Net{Mode: egress.ModeAllow, Allow: []string{"example.org"}}}
	pins := []egress.Pin{{Name: "registry.npmjs.org", Addr: netip.MustParseAddr("203.0.113.80")}}
	for _, deny := range [][]string{nil, {"example.org"}} {
		r.Net.Deny = deny
		if err := Write(l, r, pins); err != nil {
			t.Fatal(err)
		}
		got, err := egress.ReadPolicy(DirOf(l))
		if err != nil {
			t.Fatal(err)
		}
		if want := Policy(r, pins); !reflect.DeepEqual(got, want) || !reflect.DeepEqual(got.Pins, pins) {
			t.Errorf("the proxy reads %+v, want %+v with the pins", got, want)
		}
	}
	fi, err := os.Stat(DirOf(l))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("network directory: %v, %v; want 0700", fi.Mode(), err)
	}
	if filepath.Dir(LogPath(l)) != DirOf(l) {
		t.Errorf("the connection log %s is not in the network directory", LogPath(l))
	}
}
