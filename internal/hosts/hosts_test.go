package hosts

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// newRegistry is a registry where a new user's would be: the hosts
// directory in a configuration directory that does not exist yet.
func newRegistry(t *testing.T) *Registry {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "config")
	dirs := hostdir.NewTable(hostdir.Roots{}, func(k string) string {
		return map[string]string{"HOME": t.TempDir(), "XDG_CONFIG_HOME": cfg}[k]
	}, 1000)
	now := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	return &Registry{Dir: dirs.Hosts, Now: func() time.Time { return now }}
}

func TestRegistryAddListRemove(t *testing.T) {
	r := newRegistry(t)
	ctx := context.Background()
	if hs, err := r.List(); err != nil || len(hs) != 0 {
		t.Fatalf("a new registry lists %v, %v", hs, err)
	}
	if _, err := os.Stat(r.Dir.Path); !os.IsNotExist(err) {
		t.Fatalf("listing made %s", r.Dir.Path)
	}
	big, err := r.Add(ctx, "big", "qemu+ssh://ann@big.example.com/system")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Add(ctx, "here", "qemu:///system"); err != nil {
		t.Fatal(err)
	}
	want := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	if big.Name != "big" || big.URI != "qemu+ssh://ann@big.example.com/system" || !big.Added.Equal(want) {
		t.Errorf("Add gave %+v", big)
	}
	hs, err := r.List()
	if err != nil || len(hs) != 2 || hs[0].Name != "big" || hs[1].Name != "here" || hs[1].URI != "qemu:///system" || !hs[1].Added.Equal(want) {
		t.Fatalf("List: %+v, %v", hs, err)
	}
	// The directory and its parent 0700, the file 0600.
	for p, mode := range map[string]os.FileMode{filepath.Dir(r.Dir.Path): 0o700, r.Dir.Path: 0o700, r.path("big"): 0o600} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want mode %04o", p, fi.Mode(), err, mode)
		}
	}
	if err := r.Remove("big"); err != nil {
		t.Fatal(err)
	}
	if hs, err := r.List(); err != nil || len(hs) != 1 || hs[0].Name != "here" {
		t.Errorf("after rm: %+v, %v", hs, err)
	}
	if _, err := r.Get("big"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a removed host: %v", err)
	}
}

func TestRegistryRefusals(t *testing.T) {
	r := newRegistry(t)
	ctx := context.Background()
	if _, err := r.Add(ctx, "big", "qemu+ssh://ann@big/system"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, uri string
		want      []string
	}{
		{"big", "qemu:///system", []string{"host big", "exists", "qemu+ssh://ann@big/system", "agent-vm host rm big"}},
		{"local", "qemu:///system", []string{`"local" is kept for this machine`}},
		{"Big", "qemu:///system", []string{`host name "Big" is not a short name`, "lower-case"}},
		{"-x", "qemu:///system", []string{`"-x" is not a short name`}},
		{"a23456789012345678901234567890123", "qemu:///system", []string{"not a short name"}},
		{"", "qemu:///system", []string{`host name ""`}},
		{"../x", "qemu:///system", []string{"not a short name"}},
		{"other", "qemu+tcp://big/system", []string{"qemu+tcp", "no authentication"}},
	} {
		_, err := r.Add(ctx, c.name, c.uri)
		if err == nil {
			t.Errorf("Add(%q, %q) was accepted", c.name, c.uri)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Add(%q, %q): %v\nwant it to say %q", c.name, c.uri, err, w)
			}
		}
	}
	if h, err := r.Get("big"); err != nil || h.URI != "qemu+ssh://ann@big/system" {
		t.Errorf("a refused duplicate changed the host: %+v, %v", h, err)
	}
	if _, err := r.Add(ctx, "second", "qemu:///system"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nope"} {
		for what, err := range map[string]error{"Remove": r.Remove(name), "Get": func() error { _, err := r.Get(name); return err }()} {
			if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "the hosts are big, second") {
				t.Errorf("%s(%q): %v; want it to list big, second", what, name, err)
			}
		}
	}
	empty := newRegistry(t)
	if err := empty.Remove("big"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "agent-vm host add NAME URI") {
		t.Errorf("Remove in an empty registry: %v; want how to add one", err)
	}
}

// Two adds of one name at once: exactly one wins, the other is told the
// name exists, and the file is the winner's.
func TestConcurrentAddsOfOneNameOneWins(t *testing.T) {
	r := newRegistry(t)
	uris := []string{"qemu+ssh://a@one/system", "qemu+ssh://b@two/system", "qemu+ssh://c@three/system", "qemu:///system"}
	errs := make([]error, len(uris))
	var wg sync.WaitGroup
	for i, u := range uris {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.Add(context.Background(), "big", u)
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won >= 0:
			t.Errorf("both %q and %q were added as big", uris[won], uris[i])
		case err == nil:
			won = i
		case !errors.Is(err, ErrExists):
			t.Errorf("add %q: %v", uris[i], err)
		}
	}
	if won < 0 {
		t.Fatal("no add won")
	}
	if h, err := r.Get("big"); err != nil || h.URI != uris[won] {
		t.Errorf("big is %+v, %v; want the winner's %s", h, err, uris[won])
	}
}

// A damaged file is named in the error, with the fix; List still returns
// the others, and rm removes it.
func TestDamagedHostFile(t *testing.T) {
	r := newRegistry(t)
	ctx := context.Background()
	if _, err := r.Add(ctx, "good", "qemu:///system"); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"broken":  "{ not json",
		"renamed": `{"version": 1, "name": "other", "uri": "qemu:///system"}`,
		"tcp":     `{"version": 1, "name": "tcp", "uri": "qemu+tcp://x/system"}`,
		"future":  `{"version": 9, "name": "future", "uri": "qemu:///system"}`,
	} {
		if err := os.WriteFile(r.path(name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := r.Get(name)
		if err == nil || !strings.Contains(err.Error(), r.path(name)) || !strings.Contains(err.Error(), "agent-vm host rm "+name) {
			t.Errorf("Get(%s) of %s: %v; want the file named and the fix", name, content, err)
		}
	}
	hs, err := r.List()
	if len(hs) != 1 || hs[0].Name != "good" || err == nil || !strings.Contains(err.Error(), r.path("broken")) {
		t.Errorf("List: %+v, %v; want good and an error naming broken.json", hs, err)
	}
	if err := r.Remove("broken"); err != nil {
		t.Errorf("rm of a damaged host: %v", err)
	}
}

// Add replaces nothing in place: what a reader sees is the whole new file
// or none, and no temporary file is left in the directory.
func TestAddLeavesOnlyTheHostFile(t *testing.T) {
	r := newRegistry(t)
	if _, err := r.Add(context.Background(), "big", "qemu+ssh://ann@big/system"); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(r.Dir.Path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != ".lock big.json" {
		t.Errorf("the hosts directory holds %v; want .lock and big.json", names)
	}
	b, _ := os.ReadFile(r.path("big"))
	if !strings.Contains(string(b), `"version": 1`) || !strings.HasSuffix(string(b), "}\n") {
		t.Errorf("big.json:\n%s", b)
	}
}
