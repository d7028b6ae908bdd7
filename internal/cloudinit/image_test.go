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
// modules this seed has work for, and runs the stages in one Python process
// that reads YAML with libyaml. These tests hold the seed to that image:
// they read the image's recipe from its package directory.
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

// TestTheImageReadsTheSeedAsCloudInitDoes runs the image's stage server's
// switch to libyaml (use_libyaml in cloud-init-server) with Debian's real
// cloud-init and PyYAML: every rendering of the seed, and the image's
// cloud.cfg files, must read the same through cloud-init's loader either
// way, and YAML that is not valid must still fail as cloud-init expects.
func TestTheImageReadsTheSeedAsCloudInitDoes(t *testing.T) {
	rootfs := cloudInitRootfs(t)
	tmp, err := os.MkdirTemp(filepath.Join(rootfs, "tmp"), "libyaml-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	server, err := os.ReadFile(filepath.Join(imageGuest, "cloud-init-server"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "server.py"), server, 0o644); err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, c := range goldenCases(t) {
		seed, err := Render(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, "seed-"+name), seed.UserData, 0o644); err != nil {
			t.Fatal(err)
		}
		n++
	}
	inside := "/tmp/" + filepath.Base(tmp)
	const check = `
import glob, importlib.util, sys, yaml
from cloudinit import safeyaml, util
spec = importlib.util.spec_from_file_location("server", sys.argv[1] + "/server.py")
server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server)
files = sorted(glob.glob(sys.argv[1] + "/seed-*")) + ["/etc/cloud/cloud.cfg"] + sorted(glob.glob("/etc/cloud/cloud.cfg.d/*.cfg"))
texts = [open(f).read() for f in files]
before = [util.load_yaml(s) for s in texts]
pure = safeyaml.load
server.use_libyaml()
if safeyaml.load is pure:
    sys.exit("use_libyaml left cloud-init's loader in place")
after = [util.load_yaml(s) for s in texts]
for f, b, a in zip(files, before, after):
    if b != a or not isinstance(a, dict) or len(a) < 1:
        sys.exit(f"{f}: libyaml reads {a!r:.200}, cloud-init's own loader {b!r:.200}")
for loader in (pure, safeyaml.load):
    try:
        loader("a: [b\n")
        sys.exit(f"{loader} accepts YAML that is not valid")
    except yaml.YAMLError:
        pass
print(f"ok {len(files)}")
`
	out := inRootfs(t, rootfs, "python3", "-c", check, inside)
	if want := "ok "; !strings.HasPrefix(strings.TrimSpace(out), want) || strings.Contains(out, "keeps its own") {
		t.Fatalf("%s", out)
	}
	t.Logf("%s (%d renderings of the seed)", strings.TrimSpace(out), n)
}
