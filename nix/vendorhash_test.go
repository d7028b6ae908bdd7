package nix_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

var sriSHA256 = regexp.MustCompile(`^sha256-[A-Za-z0-9+/]{43}=$`)

// script runs nix/update-vendor-hash with args.
func script(t *testing.T, args ...string) result {
	t.Helper()
	tu.Program(t, "bash")
	tu.Program(t, "go")
	tu.Program(t, "nix")
	path := filepath.Join(repoRoot(t), "nix", "update-vendor-hash")
	return run(t, 5*time.Minute, "", nil, "bash", append([]string{path}, args...)...)
}

// writeModule writes a Go module into a temp dir and returns the dir.
func writeModule(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func readTrimmed(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// needNetwork runs a go command that fetches from the module proxy and skips
// (or fails, under AGENT_VM_TEST_STRICT=1) when the proxy cannot be reached.
func needNetwork(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	if r := run(t, 3*time.Minute, dir, env, tu.Program(t, "go"), args...); r.err != nil {
		tu.SkipOrFail(t, "go %s failed (is the Go module proxy reachable?): %v\n%s", strings.Join(args, " "), r.err, r.stderr)
	}
}

func TestUpdateVendorHashNoDependencies(t *testing.T) {
	dir := writeModule(t, map[string]string{
		"go.mod":  "module example.com/nodeps\n\ngo 1.24\n",
		"main.go": "package main\n\nfunc main() {}\n",
	})
	if r := script(t, "--root", dir); r.err != nil {
		t.Fatalf("update-vendor-hash: %v\n%s", r.err, r.stderr)
	}
	if got := readTrimmed(t, filepath.Join(dir, "vendorHash")); got != "null" {
		t.Errorf("vendorHash %q, want null for a module without dependencies", got)
	}
	if r := script(t, "--root", dir, "--check"); r.err != nil {
		t.Errorf("--check on a fresh vendorHash: %v\n%s", r.err, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "vendor")); !os.IsNotExist(err) {
		t.Errorf("the script left vendor/ in the module (stat: %v)", err)
	}
}

func TestUpdateVendorHashCheckFailsWhenStale(t *testing.T) {
	dir := writeModule(t, map[string]string{
		"go.mod":     "module example.com/nodeps\n\ngo 1.24\n",
		"main.go":    "package main\n\nfunc main() {}\n",
		"vendorHash": "sha256-K/QAG9mCIHe7PQhex3TntlGYAK9l0bESWk616N97dBs=\n",
	})
	r := script(t, "--root", dir, "--check")
	if r.err == nil {
		t.Fatalf("--check passed with a stale vendorHash:\n%s", r.stderr)
	}
	stderr := string(r.stderr)
	for _, want := range []string{
		"vendorHash is stale",
		"expected: null",
		"found:    sha256-K/QAG9mCIHe7PQhex3TntlGYAK9l0bESWk616N97dBs=",
		"fix:",
		"--root " + dir,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if code := exitCode(r.err); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	// --check never writes.
	if got := readTrimmed(t, filepath.Join(dir, "vendorHash")); got != "sha256-K/QAG9mCIHe7PQhex3TntlGYAK9l0bESWk616N97dBs=" {
		t.Errorf("--check rewrote vendorHash to %q", got)
	}

	if err := os.Remove(filepath.Join(dir, "vendorHash")); err != nil {
		t.Fatal(err)
	}
	if r := script(t, "--root", dir, "--check"); r.err == nil || !strings.Contains(string(r.stderr), "(missing)") {
		t.Errorf("--check without a vendorHash file: err %v, stderr %s; want a failure naming it missing", r.err, r.stderr)
	}
}

func TestUpdateVendorHashRejectsBadArguments(t *testing.T) {
	for _, args := range [][]string{{"--frobnicate"}, {"--root"}, {"--root", t.TempDir()}} {
		r := script(t, args...)
		if code := exitCode(r.err); code != 2 {
			t.Errorf("%q: exit code %d, want 2 (usage)\n%s", args, code, r.stderr)
		}
		if !strings.Contains(string(r.stderr), "hint:") {
			t.Errorf("%q: the error gives no hint:\n%s", args, r.stderr)
		}
	}
}

// A module with dependencies gets an SRI hash that is stable across runs and
// changes with the dependency set; the module's directory stays untouched.
func TestUpdateVendorHashWithDependencies(t *testing.T) {
	goMod := "module example.com/withdeps\n\ngo 1.24\n\nrequire github.com/tidwall/gjson v1.18.0\n"
	dir := writeModule(t, map[string]string{
		"go.mod":  goMod,
		"main.go": "package main\n\nimport \"github.com/tidwall/gjson\"\n\nfunc main() { _ = gjson.Get(`{}`, \"a\") }\n",
	})
	cache := []string{"GOMODCACHE=" + t.TempDir(), "GOFLAGS=-modcacherw"}
	needNetwork(t, dir, cache, "mod", "tidy")

	if r := script(t, "--root", dir); r.err != nil {
		t.Fatalf("update-vendor-hash: %v\n%s", r.err, r.stderr)
	}
	first := readTrimmed(t, filepath.Join(dir, "vendorHash"))
	if !sriSHA256.MatchString(first) {
		t.Fatalf("vendorHash %q is not an SRI sha256 hash", first)
	}
	if r := script(t, "--root", dir, "--check"); r.err != nil {
		t.Errorf("--check right after writing: %v\n%s", r.err, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "vendor")); !os.IsNotExist(err) {
		t.Errorf("the script left vendor/ in the module (stat: %v)", err)
	}
	// A stale vendor/ in the tree is ignored, as the flake source never has one.
	if err := os.MkdirAll(filepath.Join(dir, "vendor", "junk"), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := script(t, "--root", dir, "--check"); r.err != nil {
		t.Errorf("--check with a stray vendor/: %v\n%s", r.err, r.stderr)
	}

	// Another version of the dependency: the check must notice.
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(strings.Replace(goMod, "v1.18.0", "v1.17.0", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	needNetwork(t, dir, cache, "mod", "tidy")
	r := script(t, "--root", dir, "--check")
	if r.err == nil {
		t.Fatalf("--check passed after gjson v1.18.0 -> v1.17.0:\n%s", r.stderr)
	}
	if !strings.Contains(string(r.stderr), "found:    "+first) {
		t.Errorf("stderr does not name the stale hash %s:\n%s", first, r.stderr)
	}
}

// The recipe reproduces nixpkgs' own vendorHash for a real package: gron
// 0.7.1 (pkgs/by-name/gr/gron/package.nix in nixpkgs has
// vendorHash = "sha256-K/QAG9mCIHe7PQhex3TntlGYAK9l0bESWk616N97dBs=").
// The source comes from the Go module proxy, which serves the same tree as
// the tagged GitHub release for a module without a vendor directory.
func TestUpdateVendorHashMatchesNixpkgsGron(t *testing.T) {
	const want = "sha256-K/QAG9mCIHe7PQhex3TntlGYAK9l0bESWk616N97dBs="
	cache := t.TempDir()
	env := []string{"GOMODCACHE=" + cache, "GOFLAGS=-modcacherw"}
	needNetwork(t, t.TempDir(), env, "mod", "download", "github.com/tomnomnom/gron@v0.7.1")

	src := filepath.Join(cache, "github.com", "tomnomnom", "gron@v0.7.1")
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if r := script(t, "--root", dir); r.err != nil {
		t.Fatalf("update-vendor-hash: %v\n%s", r.err, r.stderr)
	}
	if got := readTrimmed(t, filepath.Join(dir, "vendorHash")); got != want {
		t.Errorf("gron 0.7.1 vendorHash %s, nixpkgs has %s", got, want)
	}
}

// The repository's own vendorHash is current (the CI check, also run by
// `go test ./...`).
func TestRepositoryVendorHashIsCurrent(t *testing.T) {
	r := script(t, "--check")
	if r.err != nil && strings.Contains(string(r.stderr), "go mod vendor failed") {
		tu.SkipOrFail(t, "go mod vendor could not run: %s", r.stderr)
	}
	if r.err != nil {
		t.Fatalf("vendorHash is stale or unreadable: %v\n%s", r.err, r.stderr)
	}
}

func TestUpdateVendorHashShellcheck(t *testing.T) {
	shellcheck := tu.Program(t, "shellcheck")
	path := filepath.Join(repoRoot(t), "nix", "update-vendor-hash")
	if r := run(t, time.Minute, "", nil, shellcheck, path); r.err != nil {
		t.Errorf("shellcheck %s: %v\n%s%s", path, r.err, r.stdout, r.stderr)
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	type exitCoder interface{ ExitCode() int }
	if e, ok := err.(exitCoder); ok {
		return e.ExitCode()
	}
	return -1
}
