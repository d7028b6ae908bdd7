package modules_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/modules"
)

func TestEmbedHoldsEveryModule(t *testing.T) {
	onDisk, err := filepath.Glob("*.nix")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(onDisk)
	got := modules.Names()
	if !slices.Equal(got, onDisk) {
		t.Fatalf("embedded modules %q, want the .nix files of modules/ %q", got, onDisk)
	}
	for _, want := range []string{"agent-mcp.nix", "guest.nix"} {
		if !slices.Contains(got, want) {
			t.Errorf("module %q is not embedded", want)
		}
	}
	for _, name := range got {
		embedded, err := fs.ReadFile(modules.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		disk, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(embedded, disk) {
			t.Errorf("embedded %s differs from modules/%s", name, name)
		}
	}
}

// writeModules writes the embedded modules into a directory of the test's,
// as agent-vm writes them out, and returns it.
func writeModules(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range modules.Names() {
		data, err := fs.ReadFile(modules.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The embedded bytes, written out as agent-vm writes them, are valid Nix.
func TestEmbeddedModulesParse(t *testing.T) {
	nixInstantiate := tu.Program(t, "nix-instantiate")
	dir := writeModules(t)
	for _, name := range modules.Names() {
		path := filepath.Join(dir, name)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, nixInstantiate, "--parse", path).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("nix-instantiate --parse %s: %v\n%s", name, err, out)
		}
	}
}

// Every ./x.nix a module imports is embedded too, so writing FS() out into
// one directory gives a self-contained set.
func TestRelativeImportsAreEmbedded(t *testing.T) {
	relative := regexp.MustCompile(`\./([A-Za-z0-9._-]+\.nix)\b`)
	for _, name := range modules.Names() {
		data, err := fs.ReadFile(modules.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, m := range relative.FindAllStringSubmatch(line, -1) {
				if !slices.Contains(modules.Names(), m[1]) {
					t.Errorf("%s imports ./%s, which is not embedded", name, m[1])
				}
			}
		}
	}
	guest, err := fs.ReadFile(modules.FS(), "guest.nix")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(guest, []byte("./agent-mcp.nix")) {
		t.Error("guest.nix does not import ./agent-mcp.nix")
	}
}

// browserCheck evaluates guest.nix's browser shims and BROWSER with the
// real nix and a stand-in for the few nixpkgs functions they use (no
// nixpkgs here), for a guest with agent-mcp, one with only the host's
// agent-vm binary, and one with neither (no agent-vm: no shims).
const browserCheck = `let
  lib = {
    mkOption = a: a; mkEnableOption = a: a; mkDefault = v: v; mkForce = v: v;
    mkIf = c: v: if c then v else { };
    hiPrio = d: d // { hiPrio = true; };
    getExe' = d: n: "${d.outPath}/bin/${n}";
    optionals = c: l: if c then l else [ ];
    optionalString = c: s: if c then s else "";
    filter = builtins.filter; findFirst = f: d: l: d; attrNames = builtins.attrNames;
    types = { }; literalExpression = x: x;
  };
  stub = { };
  pkgs = {
    writeShellScriptBin = name: text: { outPath = "/nix/store/shim-${name}"; inherit name text; };
    runCommand = name: a: b: { outPath = "/nix/store/host-agent-vm"; };
    git = stub; curl = stub; tmux = stub; nodejs = stub; python3 = stub; gcc = stub; gnumake = stub;
    ripgrep = stub; jq = stub; fd = stub; gh = stub; less = stub; unzip = stub;
  };
  guest = mcpEnable: exe:
    let
      m = import ./guest.nix {
        inherit lib pkgs;
        options.virtualisation.qemu = { };
        modulesPath = "/nonexistent";
        config = {
          agent-vm.guest = { enable = true; agentVmExecutable = exe; workspace.transport = "9p"; packages = [ ]; };
          services.agent-mcp = { enable = mcpEnable; package.outPath = "/nix/store/agent-vm"; };
          ids.gids = { };
        };
      };
    in
    {
      variables = m.config.environment.sessionVariables;
      shims = map (p: { inherit (p) name text hiPrio; }) (builtins.filter (p: p ? text) m.config.environment.systemPackages);
    };
in
{ mcp = guest true null; executable = guest false "/x/agent-vm"; none = guest false null; }
`

func TestGuestBrowserIsTheURLOpener(t *testing.T) {
	nixInstantiate := tu.Program(t, "nix-instantiate")
	dir := writeModules(t)
	if err := os.WriteFile(filepath.Join(dir, "check.nix"), []byte(browserCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nixInstantiate, "--eval", "--strict", "--json", filepath.Join(dir, "check.nix"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nix-instantiate --eval: %v\n%s", err, stderr.String())
	}
	type shim struct {
		Name, Text string
		HiPrio     bool
	}
	var got map[string]struct {
		Variables map[string]string
		Shims     []shim
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var want []shim
	for _, name := range []string{"xdg-open", "sensible-browser", "x-www-browser", "www-browser"} {
		want = append(want, shim{name, "exec /nix/store/agent-vm/bin/agent-vm open-url \"$@\"\n", true})
	}
	for _, g := range []string{"mcp", "executable"} {
		if !slices.Equal(got[g].Shims, want) {
			t.Errorf("%s: shims %+v, want %+v", g, got[g].Shims, want)
		}
		if b := got[g].Variables["BROWSER"]; b != "/nix/store/shim-xdg-open/bin/xdg-open" {
			t.Errorf("%s: BROWSER=%q", g, b)
		}
	}
	if len(got["none"].Shims) != 0 || len(got["none"].Variables) != 0 {
		t.Errorf("a guest without agent-vm: %+v", got["none"])
	}
}
