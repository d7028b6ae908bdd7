package qemu

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// virtiofsd's command line for each workspace cache mode, run directly
// (agent-vm not root) and in the jail (root, the workspace's owner known).
func TestVirtiofsdArgvGolden(t *testing.T) {
	var b strings.Builder
	c := &Virtiofsd{Path: "/usr/lib/qemu/virtiofsd"}
	for _, cache := range []string{"", driver.ShareCacheNone, driver.ShareCacheAuto, driver.ShareCacheAlways} {
		for _, euid := range []int{1000, 0} {
			l := &Launcher{Geteuid: func() int { return euid }, Self: func() (string, error) { return "/usr/bin/agent-vm", nil }}
			m := sampleMachine()
			m.Share.Cache, m.Share.UID, m.Share.GID = cache, 1000, 1000
			d, err := l.virtiofsdProcess(c, VirtiofsdShare{Share: m.Share, Socket: "/state/feature-x/run/virtiofsd.sock"})
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "# cache %q, euid %d\n%s %s\n", cache, euid, d.Path, strings.Join(d.Args, " "))
		}
	}
	tu.Golden(t, filepath.Join("testdata", "virtiofsd.golden"), []byte(b.String()))
}

// The Rust virtiofsd calls cache=none "never"; the other modes are spelt
// alike.
func TestVirtiofsdCacheWords(t *testing.T) {
	rust, c := &Virtiofsd{Rust: true}, &Virtiofsd{}
	for mode, want := range map[string][2]string{
		driver.ShareCacheNone:   {"never", "none"},
		driver.ShareCacheAuto:   {"auto", "auto"},
		driver.ShareCacheAlways: {"always", "always"},
	} {
		if got := [2]string{rust.cacheOption(mode), c.cacheOption(mode)}; got != want {
			t.Errorf("cache %s: got %q, want %q (rust, C)", mode, got, want)
		}
	}
	args := rust.args(driver.Share{Source: "/ws", Cache: driver.ShareCacheNone}, "/s.sock")
	if !strings.Contains(strings.Join(args, " "), "--cache never") {
		t.Errorf("rust args %q: want --cache never", args)
	}
}

func TestCheckShareCache(t *testing.T) {
	for _, ok := range []string{"none", "auto", "always"} {
		if err := driver.CheckShareCache(ok); err != nil {
			t.Errorf("CheckShareCache(%q) = %v", ok, err)
		}
	}
	err := driver.CheckShareCache("loose")
	if err == nil || !strings.Contains(err.Error(), `"loose"`) || !strings.Contains(err.Error(), "hint:") {
		t.Errorf("CheckShareCache(loose) = %v, want an error naming it with a hint", err)
	}
	if got := (driver.Share{}).CacheMode(); got != driver.DefaultShareCache {
		t.Errorf("unset cache mode reads %q, want %q", got, driver.DefaultShareCache)
	}
}
