package hostsetup

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/pins"
)

// resolver answers every name with the addresses of answers[name], else
// with all; a name in offline does not resolve. A stand-in for the host's
// resolver, which the tests cannot point anywhere.
type resolver struct {
	all     []string
	answers map[string][]string
	offline map[string]bool
}

func (r *resolver) lookup(_ context.Context, _, host string) ([]netip.Addr, error) {
	if r.offline[host] {
		return nil, errors.New("no such host " + host)
	}
	as, ok := r.answers[host]
	if !ok {
		as = r.all
	}
	var out []netip.Addr
	for _, a := range as {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

var (
	gateway  = netip.MustParseAddr("203.0.113.80")
	hostAddr = netip.MustParseAddr("192.168.1.5") // one of the host's own
)

func ownAddrs() ([]netip.Addr, error) {
	return []netip.Addr{hostAddr, netip.MustParseAddr("127.0.0.1")}, nil
}

func pinFile(t *testing.T) *pins.File {
	return &pins.File{Dir: hostdir.Top(filepath.Join(t.TempDir(), "config", "agent-vm"), 0o700, hostdir.InXDG)}
}

// setup's pins step: every package source answered with a gateway's
// address is pinned to it, one answered with an address of this host is
// not (and says why); run again it changes nothing; a name that moves is
// pinned anew, one that resolves to a public address loses its pin, and
// one that does not resolve keeps its pin. --no-pins records nothing and
// keeps what was recorded.
func TestPinStep(t *testing.T) {
	ctx := context.Background()
	f := pinFile(t)
	r := &resolver{all: []string{"203.0.113.80"}, answers: map[string][]string{"security.debian.org": {"192.168.1.5"}}}
	o := PinOptions{File: f, ImageDir: t.TempDir(), Lookup: r.lookup, Own: ownAddrs, Record: true}

	rep, err := Pin(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	var want []egress.Pin
	for _, n := range egress.PackageSources {
		if n != "security.debian.org" {
			want = append(want, egress.Pin{Name: n, Addr: gateway})
		}
	}
	slices.SortFunc(want, func(a, b egress.Pin) int { return strings.Compare(a.Name, b.Name) })
	if got, err := f.Read(); err != nil || !reflect.DeepEqual(got, want) || !reflect.DeepEqual(rep.Pins, want) || !rep.Recorded || !rep.Changed() {
		t.Fatalf("first run: report %+v, file %v, %v; want every source but security.debian.org pinned to %s", rep, got, err, gateway)
	}
	if c := kinds(rep.Changes); c[pins.Added] != len(want) || c[pins.Refused] != 1 {
		t.Errorf("first run's changes: %+v; want %d added and one refused", rep.Changes, len(want))
	}
	for _, c := range rep.Changes {
		if c.Kind == pins.Refused && (c.Pin.Name != "security.debian.org" || !strings.Contains(c.Why, "an address of this host: a pin never lets a VM reach this host itself")) {
			t.Errorf("the refusal: %+v", c)
		}
		if c.Kind == pins.Added && c.Why != "in 203.0.113.0/24 (documentation, TEST-NET-3), which is not globally reachable" {
			t.Errorf("a pin's reason: %+v", c)
		}
	}
	before, _ := os.ReadFile(f.Path())

	rep, err = Pin(ctx, o)
	after, _ := os.ReadFile(f.Path())
	if err != nil || rep.Changed() || kinds(rep.Changes)[pins.Unchanged] != len(want) || string(after) != string(before) {
		t.Errorf("second run: %+v, %v; want nothing changed", rep, err)
	}

	r.answers["registry.npmjs.org"] = []string{"10.1.2.3"}  // moved
	r.answers["deb.debian.org"] = []string{"151.101.2.132"} // public now
	r.offline = map[string]bool{"api.openai.com": true}     // no answer now
	rep, err = Pin(ctx, o)
	if err != nil || !rep.Changed() {
		t.Fatalf("third run: %+v, %v", rep, err)
	}
	got, _ := f.Read()
	has := func(name, addr string) bool {
		return slices.Contains(got, egress.Pin{Name: name, Addr: netip.MustParseAddr(addr)})
	}
	if !has("registry.npmjs.org", "10.1.2.3") || has("registry.npmjs.org", "203.0.113.80") || has("deb.debian.org", "203.0.113.80") || !has("api.openai.com", "203.0.113.80") {
		t.Errorf("third run's pins: %v; want npm moved to 10.1.2.3, deb.debian.org dropped, api.openai.com kept", got)
	}
	for _, w := range []pins.Change{
		{Kind: pins.Added, Pin: egress.Pin{Name: "registry.npmjs.org", Addr: netip.MustParseAddr("10.1.2.3")}, Why: "in 10.0.0.0/8 (private-use), which is not globally reachable"},
		{Kind: pins.Dropped, Pin: egress.Pin{Name: "registry.npmjs.org", Addr: gateway}, Why: "registry.npmjs.org now resolves to 10.1.2.3"},
		{Kind: pins.Dropped, Pin: egress.Pin{Name: "deb.debian.org", Addr: gateway}, Why: "deb.debian.org now resolves to 151.101.2.132, which the egress proxy reaches"},
		{Kind: pins.Kept, Pin: egress.Pin{Name: "api.openai.com", Addr: gateway}, Why: "api.openai.com did not resolve now: no such host api.openai.com"},
	} {
		if !slices.Contains(rep.Changes, w) {
			t.Errorf("third run's changes lack %+v:\n%+v", w, rep.Changes)
		}
	}

	// --no-pins: what a run would do is said, nothing is recorded, and
	// the pins recorded before stay in force.
	before, _ = os.ReadFile(f.Path())
	r.answers["registry.npmjs.org"] = []string{"10.9.9.9"}
	rep, err = Pin(ctx, PinOptions{File: f, ImageDir: o.ImageDir, Lookup: r.lookup, Own: ownAddrs})
	after, _ = os.ReadFile(f.Path())
	if err != nil || rep.Recorded || rep.Changed() || string(after) != string(before) || !reflect.DeepEqual(rep.Pins, got) ||
		!slices.Contains(rep.Changes, pins.Change{Kind: pins.Added, Pin: egress.Pin{Name: "registry.npmjs.org", Addr: netip.MustParseAddr("10.9.9.9")}, Why: "in 10.0.0.0/8 (private-use), which is not globally reachable"}) {
		t.Errorf("--no-pins: %+v, %v; want the finding reported, the file untouched and its pins in force", rep, err)
	}
}

func kinds(cs []pins.Change) map[pins.Kind]int {
	out := map[pins.Kind]int{}
	for _, c := range cs {
		out[c.Kind]++
	}
	return out
}

// A pins file setup cannot read stops it, with the hint, and nothing is
// written over it; the host's own addresses that cannot be listed too.
func TestPinStepFailures(t *testing.T) {
	ctx := context.Background()
	f := pinFile(t)
	if err := f.Dir.Make(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Path(), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &resolver{all: []string{"203.0.113.80"}}
	_, err := Pin(ctx, PinOptions{File: f, ImageDir: t.TempDir(), Lookup: r.lookup, Own: ownAddrs, Record: true})
	if err == nil || !strings.Contains(err.Error(), "is damaged") || !strings.Contains(err.Error(), "hint: remove it and run `agent-vm setup`") {
		t.Errorf("a damaged pins file: %v", err)
	}
	if b, _ := os.ReadFile(f.Path()); string(b) != "{not json" {
		t.Errorf("the damaged file was written over: %q", b)
	}
	noOwn := func() ([]netip.Addr, error) { return nil, errors.New("listing this host's addresses: no netlink") }
	if _, err := Pin(ctx, PinOptions{File: pinFile(t), ImageDir: t.TempDir(), Lookup: r.lookup, Own: noOwn, Record: true}); err == nil || !strings.Contains(err.Error(), "no netlink") {
		t.Errorf("the host's addresses unknown: %v", err)
	}
}

// The sources are the package sources, and the hosts of the mirrors the
// default base image was built with.
func TestSourcesHaveTheImagesMirrors(t *testing.T) {
	dir := t.TempDir()
	if got := Sources(dir); !reflect.DeepEqual(got, egress.PackageSources) {
		t.Errorf("without an image: %v", got)
	}
	v := filepath.Join(dir, "v1")
	if err := os.MkdirAll(v, 0o755); err != nil {
		t.Fatal(err)
	}
	m := image.Manifest{Schema: 1, Name: image.DefaultBuildName, Disk: "disk.qcow2", Mirror: "http://mirror.example.com/debian", SecurityMirror: "http://deb.debian.org/debian-security"}
	b, _ := json.Marshal(m)
	for name, content := range map[string][]byte{image.ManifestFile: b, "disk.qcow2": nil} {
		if err := os.WriteFile(filepath.Join(v, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(v, filepath.Join(dir, image.DefaultBuildName)); err != nil {
		t.Fatal(err)
	}
	if got, want := Sources(dir), append(slices.Clone(egress.PackageSources), "mirror.example.com"); !reflect.DeepEqual(got, want) {
		t.Errorf("with an image from mirror.example.com: %v, want %v", got, want)
	}
}

// doctor's egress line: a refused answer no pin covers is a finding with
// setup's fix; pinned answers are fine, and say so; an address of this
// host is a finding no pin mends; a host that resolves nothing (offline)
// is no finding; pins that cannot be read are.
func TestEgressCheck(t *testing.T) {
	ctx := context.Background()
	names := []string{"deb.debian.org", "registry.npmjs.org"}
	answers := func(r *resolver) []pins.Answer {
		own, _ := ownAddrs()
		return pins.Resolve(ctx, names, r.lookup, own)
	}
	npm := egress.Pin{Name: "registry.npmjs.org", Addr: gateway}
	deb := egress.Pin{Name: "deb.debian.org", Addr: gateway}
	for _, tc := range []struct {
		name   string
		r      *resolver
		pinned []egress.Pin
		err    error
		ok     bool
		want   []string
	}{
		{"public", &resolver{all: []string{"151.101.2.132", "2a04:4e42::644"}}, nil, nil, true, []string{"resolve to addresses the egress proxy reaches"}},
		{"a gateway in TEST-NET-3", &resolver{all: []string{"203.0.113.80"}}, []egress.Pin{npm}, nil, false,
			[]string{"deb.debian.org resolves to 203.0.113.80 here, in 203.0.113.0/24", "`agent-vm setup` pins it for every VM", "`agent-vm net allow --vm BRANCH ADDRESS`"}},
		{"pinned", &resolver{all: []string{"203.0.113.80"}}, []egress.Pin{npm, deb}, nil, true, []string{"2 of them through the pins below"}},
		{"split DNS to a private proxy", &resolver{all: []string{"10.20.30.40"}}, []egress.Pin{npm, deb}, nil, false, []string{"10.20.30.40 here, in 10.0.0.0/8 (private-use)"}},
		{"this host", &resolver{all: []string{"192.168.1.5"}}, nil, nil, false, []string{"an address of this host", "an address of this host is never pinned"}},
		{"offline", &resolver{offline: map[string]bool{"deb.debian.org": true, "registry.npmjs.org": true}}, nil, nil, true, nil},
		{"unreadable pins", &resolver{}, nil, errors.New("the pins file x is damaged"), false, []string{"the pins file x is damaged"}},
	} {
		c := egressCheck(answers(tc.r), tc.pinned, tc.err)
		text := c.Detail + " " + c.Hint
		if c.Name != "egress" || c.OK != tc.ok {
			t.Errorf("%s: %+v; want check egress with ok %v", tc.name, c, tc.ok)
		}
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: %q lacks %q", tc.name, text, w)
			}
		}
	}
}
