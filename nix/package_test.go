package nix_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// package.nix and devshell.nix name Go 1.26 (go.mod's `go 1.26.0`), so the
// flake never builds with whatever Go nixpkgs makes its default.
func TestGoIsNamedExplicitly(t *testing.T) {
	root := repoRoot(t)
	var got struct {
		Package  []string `json:"package"`
		Devshell []string `json:"devshell"`
	}
	evalJSON(t, root, `{
		package = builtins.attrNames (builtins.functionArgs (import ./nix/package.nix));
		devshell = builtins.attrNames (builtins.functionArgs (import ./nix/devshell.nix));
	}`, &got)
	if !slices.Contains(got.Package, "buildGo126Module") || slices.Contains(got.Package, "buildGoModule") {
		t.Errorf("package.nix takes %q, want buildGo126Module and not buildGoModule", got.Package)
	}
	if !slices.Contains(got.Devshell, "go_1_26") || slices.Contains(got.Devshell, "go") {
		t.Errorf("devshell.nix takes %q, want go_1_26 and not go", got.Devshell)
	}
}

// package.nix evaluated by nix with stand-ins for nixpkgs' functions: the
// wrapper appends git, ssh, QEMU and virtiofsd to PATH (the user's own come
// first), the Go builds use buildGo126Module, and integration-test's
// agent-vm is the one built with the test hooks, which the shipped one is
// not.
func TestPackageWrapsRuntimePath(t *testing.T) {
	root := repoRoot(t)
	var got struct {
		Builders []string `json:"builders"`
		Script   string   `json:"script"`
		Unwrap   string   `json:"unwrapped"`
		Main     string   `json:"main"`
		Tags     []string `json:"tags"`
		Hooks    []string `json:"hookTags"`
		ITest    string   `json:"itestWrap"`
	}
	evalJSON(t, root, `
		let
		  stub = name: { outPath = "/stub/${name}"; };
		  pkg = import ./nix/package.nix {
		    lib = {
		      fileset = { toSource = _: "/stub/src"; unions = x: x; maybeMissing = x: x; };
		      makeBinPath = ps: builtins.concatStringsSep ":" (map (p: "${p}/bin") ps);
		      platforms.linux = [ ];
		    };
		    buildGo126Module = a: a // { builder = "buildGo126Module"; outPath = "/stub/${a.pname}"; };
		    runCommand = name: env: script: env // (env.passthru or { }) // { inherit name script; outPath = "/stub/${name}"; };
		    makeBinaryWrapper = stub "makeBinaryWrapper";
		    path = "/stub/nixpkgs";
		    git = stub "git";
		    openssh = stub "openssh";
		    qemu = stub "qemu";
		    virtiofsd = stub "virtiofsd";
		  };
		in {
		  builders = [ pkg.unwrapped.builder pkg.unwrappedTestHooks.builder pkg.integration-test.builder ];
		  tags = pkg.unwrapped.tags or [ ];
		  hookTags = pkg.unwrappedTestHooks.tags or [ ];
		  itestWrap = pkg.integration-test.postInstall;
		  script = pkg.script;
		  unwrapped = pkg.unwrapped.pname;
		  main = pkg.meta.mainProgram;
		}`, &got)
	for _, b := range got.Builders {
		if b != "buildGo126Module" {
			t.Errorf("a Go build uses %q, want buildGo126Module", b)
		}
	}
	want := "makeBinaryWrapper /stub/agent-vm-unwrapped/bin/agent-vm $out/bin/agent-vm --suffix PATH : /stub/git/bin:/stub/openssh/bin:/stub/qemu/bin:/stub/virtiofsd/bin"
	if strings.TrimSpace(got.Script) != want {
		t.Errorf("wrapper script %q, want %q", strings.TrimSpace(got.Script), want)
	}
	if got.Unwrap != "agent-vm-unwrapped" || got.Main != "agent-vm" {
		t.Errorf("unwrapped %q, mainProgram %q", got.Unwrap, got.Main)
	}
	if len(got.Tags) != 0 || !slices.Equal(got.Hooks, []string{"agentvm_testhooks"}) {
		t.Errorf("build tags: the shipped agent-vm %q (want none), integration-test's %q (want agentvm_testhooks)", got.Tags, got.Hooks)
	}
	if !strings.Contains(got.ITest, "--prefix PATH : /stub/agent-vm-testhooks-0.1.0/bin") {
		t.Errorf("integration-test's wrapper %q: want the agent-vm with the test hooks on its PATH", strings.TrimSpace(got.ITest))
	}
}

// Both Go builds' source (package.nix's fileset) holds every directory of
// this module that the binaries import: a package in a directory left out
// builds here and fails only in `nix build`.
func TestPackageSourceHoldsEveryImportedDirectory(t *testing.T) {
	root := repoRoot(t)
	const module = "github.com/agent-vm/agent-vm/"
	r := run(t, time.Minute, root, nil, tu.Program(t, "go"), "list", "-deps", "-f", "{{.ImportPath}}", "./cmd/...")
	if r.err != nil {
		t.Fatalf("go list: %v\n%s", r.err, r.stderr)
	}
	need := map[string]bool{}
	for _, p := range strings.Fields(string(r.stdout)) {
		if rest, ok := strings.CutPrefix(p, module); ok {
			top, _, _ := strings.Cut(rest, "/")
			need[top] = true
		}
	}
	if !need["cmd"] || !need["internal"] || !need["integration"] {
		t.Fatalf("go list names only %v of this module: the check would prove nothing", need)
	}
	var got struct {
		AgentVM         []string `json:"agentVM"`
		IntegrationTest []string `json:"integrationTest"`
	}
	evalJSON(t, root, `
		let
		  stub = name: { outPath = "/stub/${name}"; };
		  names = fs: map (p: baseNameOf (toString p)) fs;
		  pkg = import ./nix/package.nix {
		    lib = {
		      fileset = { toSource = a: a.fileset; unions = x: x; maybeMissing = x: x; };
		      makeBinPath = ps: "";
		      platforms.linux = [ ];
		    };
		    buildGo126Module = a: a // { outPath = "/stub/${a.pname}"; };
		    runCommand = name: env: script: env // env.passthru;
		    makeBinaryWrapper = stub "makeBinaryWrapper";
		    path = "/stub/nixpkgs";
		    git = stub "git";
		    openssh = stub "openssh";
		    qemu = stub "qemu";
		    virtiofsd = stub "virtiofsd";
		  };
		in {
		  agentVM = names pkg.unwrapped.src;
		  integrationTest = names pkg.integration-test.src;
		}`, &got)
	for build, src := range map[string][]string{"agent-vm": got.AgentVM, "integration-test": got.IntegrationTest} {
		for dir := range need {
			if !slices.Contains(src, dir) {
				t.Errorf("the %s build's source (nix/package.nix fileset) lacks %s/, which the binaries import; it has %q", build, dir, src)
			}
		}
	}
}
