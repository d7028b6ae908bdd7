package nix_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// nixFiles lists every .nix file of the repository, skipping VCS data and
// build results.
func nixFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != root && (name == ".git" || name == "vendor" || strings.HasPrefix(name, "result")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ".nix") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestEveryNixFileParses(t *testing.T) {
	nixInstantiate := tu.Program(t, "nix-instantiate")
	root := repoRoot(t)
	files := nixFiles(t, root)
	rel := make([]string, 0, len(files))
	for _, f := range files {
		r, _ := filepath.Rel(root, f)
		rel = append(rel, r)
	}
	// The walk must see the files this branch owns, or the test proves nothing.
	for _, want := range []string{"flake.nix", "nix/package.nix", "nix/checks.nix", "nix/devshell.nix", "nix/vendor-hash.nix", "modules/agent-mcp.nix", "modules/guest.nix"} {
		if !slices.Contains(rel, want) {
			t.Errorf("walk of %s missed %s (found %q)", root, want, rel)
		}
	}
	for i, f := range files {
		r := run(t, time.Minute, root, nil, nixInstantiate, "--parse", f)
		if r.err != nil {
			t.Errorf("nix-instantiate --parse %s: %v\n%s", rel[i], r.err, r.stderr)
		}
	}
}

// A file with a syntax error must fail the parse check, or the check above
// could not fail either.
func TestParseCheckRejectsBrokenNix(t *testing.T) {
	nixInstantiate := tu.Program(t, "nix-instantiate")
	bad := filepath.Join(t.TempDir(), "bad.nix")
	if err := os.WriteFile(bad, []byte("{ a = 1; b = ; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(t, time.Minute, "", nil, nixInstantiate, "--parse", bad); r.err == nil {
		t.Fatalf("nix-instantiate --parse accepted %s", bad)
	}
}

// evalJSON evaluates expr with the real nix (no nixpkgs) in dir.
func evalJSON(t *testing.T, dir, expr string, into any) {
	t.Helper()
	nixInstantiate := tu.Program(t, "nix-instantiate")
	r := run(t, time.Minute, dir, nil, nixInstantiate, "--eval", "--strict", "--json", "--expr", expr)
	if r.err != nil {
		t.Fatalf("nix-instantiate --eval %s: %v\n%s", expr, r.err, r.stderr)
	}
	if err := json.Unmarshal(r.stdout, into); err != nil {
		t.Fatalf("decoding %s: %v", r.stdout, err)
	}
}

// The flake's inputs and the parts of its outputs that need no nixpkgs,
// evaluated by nix itself; nixpkgs is a value that throws when touched, so
// these outputs provably do not depend on it.
func TestFlakeOutputsWithoutNixpkgs(t *testing.T) {
	root := repoRoot(t)
	var got struct {
		Inputs      map[string]map[string]string `json:"inputs"`
		Args        map[string]bool              `json:"args"`
		Outputs     []string                     `json:"outputs"`
		Modules     map[string]string            `json:"modules"`
		OverlayIsFn bool                         `json:"overlayIsFn"`
	}
	evalJSON(t, root, `
		let
		  flake = import ./flake.nix;
		  out = flake.outputs { self = out; nixpkgs = throw "nixpkgs is not available in this test"; };
		in {
		  inherit (flake) inputs;
		  args = builtins.functionArgs flake.outputs;
		  outputs = builtins.attrNames out;
		  modules = builtins.mapAttrs (_: toString) out.nixosModules;
		  overlayIsFn = builtins.isFunction out.overlays.default;
		}`, &got)

	if want := map[string]map[string]string{"nixpkgs": {"url": "github:NixOS/nixpkgs/nixos-26.05"}}; !equalJSON(got.Inputs, want) {
		t.Errorf("inputs %v, want %v (nixpkgs only)", got.Inputs, want)
	}
	if want := map[string]bool{"self": false, "nixpkgs": false}; !equalJSON(got.Args, want) {
		t.Errorf("outputs arguments %v, want %v", got.Args, want)
	}
	wantOutputs := []string{"apps", "checks", "devShells", "formatter", "nixosModules", "overlays", "packages"}
	if !slices.Equal(got.Outputs, wantOutputs) {
		t.Errorf("outputs %q, want %q", got.Outputs, wantOutputs)
	}
	if !got.OverlayIsFn {
		t.Error("overlays.default is not a function")
	}

	// nixosModules exports exactly the embedded files: one source, two consumers.
	embedded, err := filepath.Glob(filepath.Join(root, "modules", "*.nix"))
	if err != nil {
		t.Fatal(err)
	}
	var exported []string
	for name, path := range got.Modules {
		if name == "default" {
			if path != filepath.Join(root, "modules", "agent-mcp.nix") {
				t.Errorf("nixosModules.default is %s, want modules/agent-mcp.nix (guest imports qemu-vm.nix and would turn an importing host into a VM)", path)
			}
			continue
		}
		if filepath.Base(path) != name+".nix" {
			t.Errorf("nixosModules.%s is %s, want modules/%s.nix", name, path, name)
		}
		exported = append(exported, path)
	}
	slices.Sort(exported)
	slices.Sort(embedded)
	if !slices.Equal(exported, embedded) {
		t.Errorf("nixosModules export %q, modules/ holds %q", exported, embedded)
	}
}

func equalJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}

// The vendorHash file format, read by the same nix/vendor-hash.nix that
// nix/package.nix uses.
func TestVendorHashFileFormat(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	const sri = "sha256-K/QAG9mCIHe7PQhex3TntlGYAK9l0bESWk616N97dBs="
	cases := []struct {
		name, content string
		want          any // nil for a null hash
		wantErr       string
	}{
		{"null", "null\n", nil, ""},
		{"sri", sri + "\n", sri, ""},
		{"no-newline", sri, sri, ""},
		{"garbage", "sha256-tooshort\n", nil, `not an SRI sha256 hash or null`},
		{"empty", "", nil, `not an SRI sha256 hash or null`},
	}
	nixInstantiate := tu.Program(t, "nix-instantiate")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, tc.name)
			if err := os.WriteFile(file, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			expr := "import " + filepath.Join(root, "nix", "vendor-hash.nix") + " " + file
			r := run(t, time.Minute, root, nil, nixInstantiate, "--eval", "--strict", "--json", "--expr", expr)
			if tc.wantErr != "" {
				if r.err == nil || !strings.Contains(string(r.stderr), tc.wantErr) || !strings.Contains(string(r.stderr), "nix/update-vendor-hash") {
					t.Fatalf("got %s (err %v, stderr %s), want an error with %q and the fix", r.stdout, r.err, r.stderr, tc.wantErr)
				}
				return
			}
			if r.err != nil {
				t.Fatalf("eval: %v\n%s", r.err, r.stderr)
			}
			var got any
			if err := json.Unmarshal(r.stdout, &got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	// The committed file is well-formed too.
	var committed any
	evalJSON(t, root, "import ./nix/vendor-hash.nix ./vendorHash", &committed)
}
