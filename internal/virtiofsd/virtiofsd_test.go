package virtiofsd

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// virtiofsd's command line for each workspace cache mode, run directly
// (agent-vm not root) and in the jail (root, the workspace's owner known).
func TestVirtiofsdArgvGolden(t *testing.T) {
	var b strings.Builder
	c := &Binary{Path: "/usr/lib/qemu/virtiofsd"}
	for _, cache := range []string{"", driver.ShareCacheNone, driver.ShareCacheAuto, driver.ShareCacheAlways} {
		for _, euid := range []int{1000, 0} {
			o := Options{Geteuid: func() int { return euid }, Self: func() (string, error) { return "/usr/bin/agent-vm", nil }}
			share := driver.Share{Source: "/state/feature-x/workspace", Tag: "workspace", Cache: cache, UID: 1000, GID: 1000}
			d, err := Process(c, Spec{Share: share, Socket: "/state/feature-x/run/virtiofsd.sock"}, o)
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
	rust, c := &Binary{Rust: true}, &Binary{}
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

// A FAKE runner (execxtest) stands in for a host without virtiofsd: it
// answers LookPath with "not found" and fails on anything else.
func TestMissingVirtiofsdNamesThePackages(t *testing.T) {
	fake := execxtest.New(t).Installed("virtiofsd", "")
	_, err := find(context.Background(), fake, []string{t.TempDir() + "/virtiofsd"})
	if err == nil || !strings.Contains(err.Error(), "qemu-system-common") || !strings.Contains(err.Error(), "9p") {
		t.Errorf("got %v", err)
	}
}
