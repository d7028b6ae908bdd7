package cloudinit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// agent-vm's own base image (internal/image) runs only the cloud-init
// modules this seed has work for. This test holds the seed to that image:
// it reads the image's recipe from its package directory.
const imageGuest = "../image/guest"

// seedModules says, for each top-level key the seed's user-data may set,
// the modules that act on it and the stage each runs in (cloud-init's
// cloud_<stage>_modules). A new key fails the test below until it is here
// and the image runs its modules.
var seedModules = map[string][]string{
	"hostname":          {"init:set_hostname", "init:update_hostname"},
	"preserve_hostname": {"init:set_hostname", "init:update_hostname"},
	"manage_etc_hosts":  {"init:update_etc_hosts"},
	"locale":            {"config:locale"},
	"bootcmd":           {"init:bootcmd"},
	"write_files":       {"init:write_files", "final:write_files_deferred"},
	"users":             {"init:users_groups"},
	"disable_root":      {"init:ssh"},
	"ssh_deletekeys":    {"init:ssh"},
	"ssh_genkeytypes":   {"init:ssh"},
	"ssh_keys":          {"init:ssh"},
	"runcmd":            {"config:runcmd", "final:scripts_user"},
}

// alwaysModules act without a key: the root filesystem grown to the
// overlay's size, the seed's random seed, and what the first boot prints.
var alwaysModules = []string{"init:seed_random", "init:resizefs", "final:ssh_authkey_fingerprints", "final:keys_to_console", "final:final_message"}

// imageModules reads the module lists the image's recipe writes into
// /etc/cloud/cloud.cfg.d, as "stage:module" with cloud-init's '-' read as
// '_' (it accepts both).
func imageModules(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(imageGuest, "customize.sh"))
	if err != nil {
		t.Fatal(err)
	}
	lists := regexp.MustCompile(`(?m)^cloud_(init|config|final)_modules: \[(.*)\]$`).FindAllStringSubmatch(string(b), -1)
	if len(lists) != 3 {
		t.Fatalf("the image's customize.sh has %d cloud_*_modules lists, want 3", len(lists))
	}
	have := map[string]bool{}
	for _, l := range lists {
		for _, m := range strings.Split(l[2], ",") {
			have[l[1]+":"+strings.ReplaceAll(strings.TrimSpace(m), "-", "_")] = true
		}
	}
	return have
}

func TestTheImageRunsTheModulesTheSeedUses(t *testing.T) {
	have := imageModules(t)
	keys := map[string]bool{}
	for name, c := range goldenCases(t) {
		seed, err := Render(c)
		if err != nil {
			t.Fatal(err)
		}
		var ud map[string]json.RawMessage
		if err := json.Unmarshal(seed.UserData[len("#cloud-config\n"):], &ud); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for k := range ud {
			keys[k] = true
		}
	}
	if len(keys) < 10 {
		t.Fatalf("the seed sets only %d keys: the check proves nothing", len(keys))
	}
	var want []string
	for k := range keys {
		mods, ok := seedModules[k]
		if !ok {
			t.Errorf("the seed sets %q, which seedModules does not know: name the modules that act on it, and add them to the image's lists in %s/customize.sh (and bump image.BuilderVersion)", k, imageGuest)
		}
		want = append(want, mods...)
	}
	want = append(want, alwaysModules...)
	sort.Strings(want)
	for _, m := range slices.Compact(want) {
		if !have[m] {
			t.Errorf("the image does not run %s (stage:module), which the seed needs (hint: add it to cloud_%s_modules in %s/customize.sh and bump image.BuilderVersion)",
				m, strings.SplitN(m, ":", 2)[0], imageGuest)
		}
	}
}
