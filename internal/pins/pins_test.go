package pins

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostdir"
)

func pin(name, addr string) egress.Pin {
	return egress.Pin{Name: name, Addr: netip.MustParseAddr(addr)}
}

func newFile(t *testing.T) *File {
	return &File{Dir: hostdir.Top(filepath.Join(t.TempDir(), "config", "agent-vm"), 0o700, hostdir.InXDG)}
}

// The file: written sorted, read back as written, the user's alone (0600
// in the 0700 configuration directory, made as the table says); no pins
// removes it, and a missing file is no pins.
func TestFileRoundTrip(t *testing.T) {
	f := newFile(t)
	if got, err := f.Read(); err != nil || got != nil {
		t.Fatalf("no file: %v, %v; want no pins", got, err)
	}
	in := []egress.Pin{pin("registry.npmjs.org", "203.0.113.80"), pin("deb.debian.org", "203.0.113.80"), pin("deb.debian.org", "10.0.0.1")}
	if err := f.Write(in); err != nil {
		t.Fatal(err)
	}
	want := []egress.Pin{pin("deb.debian.org", "10.0.0.1"), pin("deb.debian.org", "203.0.113.80"), pin("registry.npmjs.org", "203.0.113.80")}
	if got, err := f.Read(); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("read back %v, %v; want %v", got, err, want)
	}
	b, _ := os.ReadFile(f.Path())
	if !strings.Contains(string(b), `"version": 1`) || !strings.Contains(string(b), `{
      "name": "deb.debian.org",
      "addr": "10.0.0.1"
    }`) {
		t.Errorf("the file reads:\n%s", b)
	}
	for path, mode := range map[string]os.FileMode{f.Path(): 0o600, f.Dir.Path: 0o700} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want %04o", path, fi.Mode(), err, mode)
		}
	}
	if err := f.Write(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no pins left the file: %v", err)
	}
	if err := f.Write(nil); err != nil {
		t.Errorf("no pins, no file: %v", err)
	}
	var none *File
	if got, err := none.Read(); got != nil || err != nil || none.Write(in) == nil {
		t.Errorf("a nil File reads %v, %v, and must refuse a write", got, err)
	}
}

// A file that is not the pins file says so, names it and the fix.
func TestDamagedFile(t *testing.T) {
	f := newFile(t)
	if err := f.Dir.Make(); err != nil {
		t.Fatal(err)
	}
	for content, says := range map[string]string{
		"{":                          "unexpected end of JSON input",
		`{"version": 2, "pins": []}`: "version 2, not 1",
		`{"version": 1, "pins": [{"name": "a"}]}`:              "a pin without a name or an address",
		`{"version": 1, "pins": [{"name": "a", "addr": "x"}]}`: `ParseAddr("x")`,
	} {
		if err := os.WriteFile(f.Path(), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := f.Read()
		if err == nil || !strings.Contains(err.Error(), f.Path()+" is damaged") || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "run `agent-vm setup`") {
			t.Errorf("%s: %v; want it damaged: %s, with the fix", content, err, says)
		}
	}
	if err := os.Chmod(f.Dir.Path, 0o000); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(f.Dir.Path, 0o700) })
	if os.Geteuid() != 0 {
		if _, err := f.Read(); err == nil || !strings.Contains(err.Error(), "reading the pins") {
			t.Errorf("an unreadable file: %v", err)
		}
	}
}

// Resolve judges each answer as the proxy does: public addresses pass,
// others are refused with the proxy's reason, the host's own marked so;
// IPv4-mapped answers are their IPv4 address, given once; a name that
// does not resolve (or resolves to nothing) is its error.
func TestResolve(t *testing.T) {
	answers := map[string][]netip.Addr{
		"public.test":  {netip.MustParseAddr("151.101.2.132")},
		"gateway.test": {netip.MustParseAddr("::ffff:203.0.113.80"), netip.MustParseAddr("203.0.113.80"), netip.MustParseAddr("151.101.2.132")},
		"host.test":    {netip.MustParseAddr("192.168.1.5")},
		"empty.test":   nil,
	}
	lookup := func(_ context.Context, network, host string) ([]netip.Addr, error) {
		if network != "ip" {
			t.Errorf("looked %s up for %q, want ip", host, network)
		}
		as, ok := answers[host]
		if !ok {
			return nil, errors.New("no such host")
		}
		return as, nil
	}
	got := Resolve(context.Background(), []string{"public.test", "gateway.test", "host.test", "gone.test", "empty.test"}, lookup, []netip.Addr{netip.MustParseAddr("192.168.1.5")})
	gw := netip.MustParseAddr("203.0.113.80")
	if len(got) != 5 || got[0].Err != nil || len(got[0].Refused) != 0 ||
		!reflect.DeepEqual(got[1].Addrs, []netip.Addr{gw, netip.MustParseAddr("151.101.2.132")}) ||
		!reflect.DeepEqual(got[1].Refused, []egress.Refusal{{Addr: gw, Why: "in 203.0.113.0/24 (documentation, TEST-NET-3), which is not globally reachable"}}) ||
		!reflect.DeepEqual(got[2].Refused, []egress.Refusal{{Addr: netip.MustParseAddr("192.168.1.5"), Why: "an address of this host", Own: true}}) ||
		got[3].Err == nil || got[4].Err == nil || got[4].Err.Error() != "no address" {
		t.Errorf("Resolve = %+v", got)
	}
}

// Update pins each refused answer that is not the host's own, keeps a
// name's pins when it did not resolve, and drops the rest with why; its
// pins are sorted and each once.
func TestUpdate(t *testing.T) {
	gw := "203.0.113.80"
	refused := func(name string, addrs ...string) Answer {
		a := Answer{Name: name}
		for _, s := range addrs {
			ad := netip.MustParseAddr(s)
			a.Addrs = append(a.Addrs, ad)
			if r, ok := egress.Judge(ad, []netip.Addr{netip.MustParseAddr("192.168.1.5")}); ok {
				a.Refused = append(a.Refused, r)
			}
		}
		return a
	}
	old := []egress.Pin{pin("a.test", gw), pin("b.test", gw), pin("c.test", gw), pin("d.test", gw), pin("gone.test", gw), pin("own.test", gw)}
	answers := []Answer{
		refused("a.test", gw),              // unchanged
		refused("b.test", "10.0.0.7"),      // moved
		refused("c.test", "151.101.2.132"), // public now
		{Name: "d.test", Err: errors.New("timeout")},
		refused("new.test", gw, gw), // new, given twice (Resolve gives it once)
		refused("own.test", "192.168.1.5"),
	}
	pins, changes := Update(old, answers)
	wantPins := []egress.Pin{pin("a.test", gw), pin("b.test", "10.0.0.7"), pin("d.test", gw), pin("new.test", gw)}
	if !reflect.DeepEqual(pins, wantPins) {
		t.Errorf("pins = %v, want %v", pins, wantPins)
	}
	tn3 := "in 203.0.113.0/24 (documentation, TEST-NET-3), which is not globally reachable"
	want := []Change{
		{Kind: Unchanged, Pin: pin("a.test", gw), Why: tn3},
		{Kind: Added, Pin: pin("b.test", "10.0.0.7"), Why: "in 10.0.0.0/8 (private-use), which is not globally reachable"},
		{Kind: Dropped, Pin: pin("b.test", gw), Why: "b.test now resolves to 10.0.0.7"},
		{Kind: Dropped, Pin: pin("c.test", gw), Why: "c.test now resolves to 151.101.2.132, which the egress proxy reaches"},
		{Kind: Kept, Pin: pin("d.test", gw), Why: "d.test did not resolve now: timeout"},
		{Kind: Added, Pin: pin("new.test", gw), Why: tn3},
		{Kind: Refused, Pin: pin("own.test", "192.168.1.5"), Why: "an address of this host: a pin never lets a VM reach this host itself"},
		{Kind: Dropped, Pin: pin("own.test", gw), Why: "own.test now resolves to 192.168.1.5"},
		{Kind: Dropped, Pin: pin("gone.test", gw), Why: "gone.test is not a package source agent-vm pins any more"},
	}
	if !reflect.DeepEqual(changes, want) {
		t.Errorf("changes:\n%+v\nwant\n%+v", changes, want)
	}
	if !Changed(changes) || Changed(changes[:1]) {
		t.Error("Changed does not tell an added or dropped pin from an unchanged one")
	}
	if got := Unpinned(wantPins[:2], answers[:3]); len(got) != 0 {
		t.Errorf("Unpinned with a.test and b.test pinned = %+v; want none (c.test is public)", got)
	}
	// own.test's address is pinned (by hand): the proxy refuses it all the
	// same, and so does doctor.
	unpinned := Unpinned(append(wantPins[:1:1], pin("own.test", "192.168.1.5")), []Answer{answers[0], answers[1], answers[3], refused("new.test", gw), answers[5]})
	if want := []Change{want[1], want[5], want[6]}; !reflect.DeepEqual(unpinned, want) {
		t.Errorf("Unpinned = %+v; want %+v: b.test's and new.test's to pin, own.test's never", unpinned, want)
	}
}
