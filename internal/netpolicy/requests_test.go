package netpolicy

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/state"
)

func ruleStrings(rules []egress.RequestRule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.String())
	}
	return out
}

// githubFor is the GitHub defaults for upstream owner/repo, in the order
// they are tried.
func githubFor(repo string) []string {
	return []string{
		"allow POST api.github.com/graphql graphql:createPullRequest,addComment",
		"deny * api.github.com/graphql",
		"allow GET api.github.com/**",
		"allow HEAD api.github.com/**",
		"allow POST api.github.com/repos/" + repo + "/pulls",
		"allow POST api.github.com/repos/" + repo + "/issues",
		"allow POST api.github.com/repos/" + repo + "/issues/*/comments",
		"allow POST api.github.com/repos/" + repo + "/pulls/*/comments",
		"deny * api.github.com/**",
	}
}

var (
	wantGitHub = githubFor("o/r")
	// The defaults when the upstream's path makes no repository rule.
	noRepo = []string{wantGitHub[0], wantGitHub[1], wantGitHub[2], wantGitHub[3], wantGitHub[8]}
)

// An upstream on github.com, in any of its URL forms, gets the GitHub
// defaults for its repository; one elsewhere, or none, gets no rule.
func TestDefaultRequestRules(t *testing.T) {
	for upstream, want := range map[string][]string{
		"git@github.com:o/r.git":        wantGitHub,
		"https://github.com/o/r":        wantGitHub,
		"https://GitHub.com/o/r.git/":   wantGitHub,
		"ssh://git@github.com:22/o/r":   wantGitHub,
		"https://user@github.com/O/r-2": githubFor("O/r-2"),
		"https://github.com/o/r/extra":  noRepo,
		"https://github.com/o/it's":     noRepo,
		"https://gitlab.com/o/r.git":    {"allow POST gitlab.com/api/graphql graphql", "deny * gitlab.com/api/graphql"},
		"git@github.example.com:o/r":    nil,
		"https://api.github.com/o/r":    nil,
		"/home/u/src/r":                 nil,
		"":                              nil,
		"file:///github.com/o/r":        nil,
	} {
		r := &state.Record{Git: state.Git{UpstreamURL: upstream}}
		if got := ruleStrings(Policy(r, nil).Requests); !reflect.DeepEqual(got, want) {
			t.Errorf("upstream %q: request rules\n%q\nwant\n%q", upstream, got, want)
		}
	}
}

// The user's rules, newest first, come before the defaults; net show
// lists them all in that order, the defaults marked.
func TestUserRulesBeforeTheDefaults(t *testing.T) {
	r := &state.Record{Git: state.Git{UpstreamURL: "git@github.com:o/r.git"},
		Net: &state.Net{Requests: []string{"allow PUT api.github.com/repos/o/r/pulls/*/merge", "deny POST api.github.com/repos/o/r/issues"}}}
	got := ruleStrings(Policy(r, nil).Requests)
	want := append([]string{"allow PUT api.github.com/repos/o/r/pulls/*/merge", "deny POST api.github.com/repos/o/r/issues"}, wantGitHub...)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("request rules %q\nwant %q", got, want)
	}
	info := InfoOf(state.Entry{Record: r}, true, nil)
	if len(info.Requests) != len(want) || info.Requests[1] != (RequestRule{Rule: want[1]}) || info.Requests[2] != (RequestRule{Rule: want[2], Default: true}) {
		t.Errorf("net show's rules: %+v", info.Requests)
	}
}

// fakeVMs is one VM whose record is in a directory of the test's: stopped
// unless running; the host's pins are pins.
type fakeVMs struct {
	e         state.Entry
	running   bool
	pins      []egress.Pin
	published int    // Publish's calls
	placedOn  string // the registered host the VM is placed on, "" for this machine
}

func newFakeVMs(t *testing.T, r *state.Record) *fakeVMs {
	dir := t.TempDir()
	r.Version, r.Branch, r.Slug, r.Ports = state.RecordVersion, "feat", "feat", state.Ports{SSH: 2222, MCP: 2223}
	e := state.Entry{Slug: "feat", Layout: state.Layout{Dir: dir}, Record: r}
	if err := state.WriteRecord(e.Layout.Record(), r); err != nil {
		t.Fatal(err)
	}
	return &fakeVMs{e: e}
}

func (f *fakeVMs) read(ctx context.Context, name string) (state.Entry, error) {
	if name != "feat" {
		return state.Entry{}, state.NotFound("no VM " + name)
	}
	r, err := state.ReadRecord(f.e.Layout.Record())
	e := f.e
	e.Record = r
	return e, err
}

func (f *fakeVMs) Recorded(ctx context.Context, name string) (state.Entry, error) {
	return f.read(ctx, name)
}

func (f *fakeVMs) Locked(ctx context.Context, name string) (state.Entry, *state.Lock, error) {
	e, err := f.read(ctx, name)
	if err != nil {
		return e, nil, err
	}
	l, err := state.AcquireLock(ctx, filepath.Join(f.e.Layout.Dir, "lock"))
	return e, l, err
}

func (f *fakeVMs) TryLockVM(slug string) (*state.Lock, bool, error) {
	if slug != "feat" {
		return nil, false, state.NotFound("no VM " + slug)
	}
	return state.TryLock(filepath.Join(f.e.Layout.Dir, "lock"))
}

func (f *fakeVMs) State(context.Context, state.Entry) string {
	if f.running {
		return driver.StateRunning
	}
	return driver.StateStopped
}
func (f *fakeVMs) Contains(*state.Record) bool { return true }
func (f *fakeVMs) Pins() ([]egress.Pin, error) { return f.pins, nil }

// Publish and PullLog: the VM is on this machine (its proxy reads the
// files here), so there is nothing to do but count.
func (f *fakeVMs) Publish(context.Context, state.Entry) error { f.published++; return nil }
func (f *fakeVMs) PullLog(context.Context, state.Entry, bool) (func(), error) {
	return func() {}, nil
}
func (f *fakeVMs) WorkspacePath(r *state.Record, l state.Layout) (string, string) {
	return l.Workspace(), f.placedOn
}

// net allow|deny with a request rule: checked, kept in the record as its
// canonical text, newest first, one of a pattern; the policy file has it
// before the defaults. Destinations given beside it are as before.
func TestAllowDenyRequestRules(t *testing.T) {
	ctx := context.Background()
	vms := newFakeVMs(t, &state.Record{Git: state.Git{UpstreamURL: "https://github.com/o/r"}})
	steps := []struct {
		allow    bool
		patterns []string
		want     []string
	}{
		{true, []string{"post API.github.com/repos/o/r/pulls/*/merge"}, []string{"allow POST api.github.com/repos/o/r/pulls/*/merge"}},
		{false, []string{"DELETE api.github.com/repos/o/r/git/refs/**", "example.org"},
			[]string{"deny DELETE api.github.com/repos/o/r/git/refs/**", "allow POST api.github.com/repos/o/r/pulls/*/merge"}},
		{false, []string{"POST api.github.com/repos/o/r/pulls/*/merge", "GET api.github.com/user"},
			[]string{"deny POST api.github.com/repos/o/r/pulls/*/merge", "deny GET api.github.com/user", "deny DELETE api.github.com/repos/o/r/git/refs/**"}},
		{true, []string{"POST api.github.com/graphql graphql:mergePullRequest"},
			[]string{"allow POST api.github.com/graphql graphql:mergePullRequest", "deny POST api.github.com/repos/o/r/pulls/*/merge", "deny GET api.github.com/user", "deny DELETE api.github.com/repos/o/r/git/refs/**"}},
	}
	for _, s := range steps {
		edit := Deny
		if s.allow {
			edit = Allow
		}
		ch, err := edit(ctx, vms, "feat", s.patterns)
		if err != nil {
			t.Fatalf("%v: %v", s.patterns, err)
		}
		e, _ := vms.Recorded(ctx, "feat")
		if !reflect.DeepEqual(e.Record.Net.Requests, s.want) {
			t.Errorf("after %v the record has %q, want %q", s.patterns, e.Record.Net.Requests, s.want)
		}
		if ch.Live || len(ch.Info.Requests) != len(s.want)+len(wantGitHub) || ch.Info.Requests[0].Rule != s.want[0] {
			t.Errorf("after %v the change says %+v", s.patterns, ch)
		}
		pol, err := egress.ReadPolicy(DirOf(e.Layout))
		if err != nil {
			t.Fatal(err)
		}
		if got := ruleStrings(pol.Requests); !reflect.DeepEqual(got, append(append([]string{}, s.want...), wantGitHub...)) {
			t.Errorf("after %v the proxy reads the rules %q", s.patterns, got)
		}
	}
	e, _ := vms.Recorded(ctx, "feat")
	if !reflect.DeepEqual(e.Record.Net.Deny, []string{"example.org"}) {
		t.Errorf("the destination given beside the rules: deny = %q", e.Record.Net.Deny)
	}

	// Bad input changes nothing and says why.
	before := e.Record.Net.Requests
	for _, c := range []struct {
		allow   bool
		pattern string
		want    string
	}{
		{true, "FOO api.github.com/x", `request rule "FOO api.github.com/x": "FOO" is not an HTTP method`},
		{true, "GET /x", "no host before the path"},
		{true, "GET api.github.com", "no path after the host (hint: GET api.github.com/** for every path)"},
		{true, "GET 1.2.3.4/x", "is an IP address: a rule names the host a secret is bound to, whose requests the proxy reads (hint: its name"},
		{true, " ", "is not a domain name"},
		{true, "", "is not a domain name"},
		{false, "POST api.github.com/graphql graphql:a", "a deny rule has no graphql condition"},
	} {
		edit := Deny
		if c.allow {
			edit = Allow
		}
		_, err := edit(ctx, vms, "feat", []string{"example.com", c.pattern})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v; want an error with %q", c.pattern, err, c.want)
		}
		e, _ := vms.Recorded(ctx, "feat")
		if !reflect.DeepEqual(e.Record.Net.Requests, before) || len(e.Record.Net.Allow) != 0 || len(e.Record.Net.Deny) != 1 {
			t.Errorf("%q changed the record: %+v", c.pattern, e.Record.Net)
		}
	}
	if _, err := Allow(ctx, vms, "feat", nil); err == nil || !strings.Contains(err.Error(), "'POST api.github.com/repos/o/r/pulls'") {
		t.Errorf("nothing to allow: %v", err)
	}
}

// A host a secret is bound to is closed to writes unless a rule allows
// them: read, and for the upstream's host git's smart HTTP of the
// upstream (and fetches of any owner/name), then denied; GitHub
// Enterprise's API on the upstream's host gets GitHub's defaults; the
// agents' APIs stay open, api.github.com has GitHub's defaults whatever
// the upstream.
func TestBoundHostsAreClosedToWrites(t *testing.T) {
	closed := func(host, repo string) []string {
		out := []string{"allow GET " + host + "/**", "allow HEAD " + host + "/**", "allow OPTIONS " + host + "/**"}
		if repo != "" {
			for _, p := range []string{repo, repo + ".git"} {
				out = append(out, "allow POST "+host+p+"/git-upload-pack", "allow POST "+host+p+"/git-receive-pack",
					"allow POST "+host+p+"/info/lfs/objects/batch", "allow POST "+host+p+"/info/lfs/locks/verify")
			}
			out = append(out, "allow POST "+host+"/*/*/git-upload-pack")
		}
		return append(out, "deny * "+host+"/**")
	}
	ghe := []string{
		"allow POST ghe.example.com/api/graphql graphql:createPullRequest,addComment",
		"deny * ghe.example.com/api/graphql",
		"allow GET ghe.example.com/**",
		"allow HEAD ghe.example.com/**",
		"allow POST ghe.example.com/api/v3/repos/o/r/pulls",
		"allow POST ghe.example.com/api/v3/repos/o/r/issues",
		"allow POST ghe.example.com/api/v3/repos/o/r/issues/*/comments",
		"allow POST ghe.example.com/api/v3/repos/o/r/pulls/*/comments",
	}
	githubNoRepo := []string{wantGitHub[0], wantGitHub[1], wantGitHub[2], wantGitHub[3], wantGitHub[8]}
	for _, c := range []struct {
		upstream string
		hosts    []string
		want     []string
	}{
		{"git@github.com:o/r.git", []string{"github.com", "api.github.com", "api.anthropic.com"}, append(append([]string{}, wantGitHub...), closed("github.com", "/o/r")...)},
		{"https://ghe.example.com/o/r.git", []string{"ghe.example.com"}, append(append([]string{}, ghe...), closed("ghe.example.com", "/o/r")...)},
		{"https://gitlab.com/o/r.git", []string{"deploy.example.com", "gitlab.com", "api.openai.com"}, append(append([]string{"allow POST gitlab.com/api/graphql graphql", "deny * gitlab.com/api/graphql"}, closed("deploy.example.com", "")...), closed("gitlab.com", "/o/r")...)},
		{"https://gitlab.com/o/r.git", []string{"api.github.com", "github.com"}, append(append([]string{"allow POST gitlab.com/api/graphql graphql", "deny * gitlab.com/api/graphql"}, githubNoRepo...), closed("github.com", "")...)},
	} {
		r := &state.Record{Git: state.Git{UpstreamURL: c.upstream}, SecretHosts: c.hosts}
		if got := ruleStrings(Policy(r, nil).Requests); !reflect.DeepEqual(got, c.want) {
			t.Errorf("upstream %s, secrets for %v: request rules\n%q\nwant\n%q", c.upstream, c.hosts, got, c.want)
		}
	}
}
