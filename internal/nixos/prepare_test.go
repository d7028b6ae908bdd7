package nixos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/qemu"
)

// These tests put a FAKE nix at the exec boundary (execxtest): nixpkgs
// cannot be evaluated on machines without a recent nix, so the fake records
// the exact commands and answers like nix would. Everything above it (file
// rendering, caching, the plan handed to the launcher) is the real code.

// staticBinary builds a tiny statically linked program to stand in for the
// agent-vm binary the guest runs.
func staticBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\nfunc main() {}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module x\ngo 1.24\n"), 0o644)
	out := filepath.Join(dir, "agent-vm")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building a static test binary: %v\n%s", err, b)
	}
	return out
}

// fakeNix answers `nix --version` and `nix build` (writing real output
// files and, for --out-link L, the links L and L-1, as a build would) and
// counts builds.
type fakeNix struct {
	version string
	store   string
	builds  int
	fail    string // stderr of a failing build
}

func (f *fakeNix) handler(t *testing.T, transport string) execxtest.Handler {
	return func(c execxtest.Call) execxtest.Reply {
		if len(c.Args) == 1 && c.Args[0] == "--version" {
			return execxtest.Reply{Stdout: "nix (Nix) " + f.version + "\n"}
		}
		if f.fail != "" {
			return execxtest.Reply{Stderr: f.fail, ExitCode: 1}
		}
		f.builds++
		vm := filepath.Join(f.store, fmt.Sprintf("build%d-nixos-vm", f.builds))
		os.MkdirAll(filepath.Join(vm, "bin"), 0o755)
		os.WriteFile(filepath.Join(vm, "bin", "run-feature-x-vm"), []byte("#!/bin/sh\n"), 0o755)
		launcher := filepath.Join(f.store, fmt.Sprintf("build%d-launcher.json", f.builds))
		os.WriteFile(launcher, []byte(fmt.Sprintf(`{"name":"feature-x","runScript":"bin/run-feature-x-vm","memorySize":2048,"cores":2,
			"workspace":{"transport":%q,"mountPoint":"/workspace","tag":"workspace"}}`, transport)), 0o644)
		for i, a := range c.Args {
			if a == "--out-link" && i+1 < len(c.Args) {
				for j, target := range []string{vm, launcher} {
					link := c.Args[i+1] + []string{"", "-1"}[j]
					os.Remove(link)
					os.Symlink(target, link)
				}
			}
		}
		return execxtest.Reply{Stdout: fmt.Sprintf(`[{"drvPath":"/nix/store/a.drv","outputs":{"out":%q}},{"drvPath":"/nix/store/b.drv","outputs":{"out":%q}}]`, vm, launcher)}
	}
}

func newTestBackend(t *testing.T, fake *execxtest.Fake, exe string) *Backend {
	nixpkgs := t.TempDir()
	os.MkdirAll(filepath.Join(nixpkgs, "nixos", "lib"), 0o755)
	os.WriteFile(filepath.Join(nixpkgs, "nixos", "lib", "eval-config.nix"), nil, 0o644)
	return &Backend{Run: fake, Log: hclog.NewNullLogger(), Pinned: nixpkgs,
		Getenv: func(string) string { return "" }, Executable: func() (string, error) { return exe, nil }}
}

func TestPrepareBuildsOnceAndHandsTheRunScriptToTheLauncher(t *testing.T) {
	exe := staticBinary(t)
	fake := execxtest.New(t)
	nix := &fakeNix{version: "2.24.10", store: t.TempDir()}
	fake.On("nix", nix.handler(t, "virtiofs"))
	b := newTestBackend(t, fake, exe)
	l, r := testVM(t, "feature/x", "k")
	os.MkdirAll(l.RunDir(), 0o700)
	if err := b.Provision(context.Background(), l, r, backend.CreateFlags{}); err != nil {
		t.Fatal(err)
	}
	plan, err := b.Prepare(context.Background(), l, r, backend.PrepareOptions{Share: driver.ShareVirtiofs})
	if err != nil {
		t.Fatal(err)
	}
	var build execxtest.Call
	for _, c := range fake.Calls() {
		if len(c.Args) > 2 && c.Args[2] == "build" {
			build = c
		}
	}
	want := []string{"--extra-experimental-features", "nix-command", "build", "--out-link", filepath.Join(l.Dir, "nix-gcroot"),
		"--print-out-paths", "--json", "--file", filepath.Join(l.Dir, "default.nix"), "vm", "launcher"}
	if strings.Join(build.Args, " ") != strings.Join(want, " ") {
		t.Errorf("nix build args:\n got %q\nwant %q", build.Args, want)
	}
	boot, _ := plan.Boot.(qemu.Boot)
	s := boot.Script
	if s == nil || s.Path != filepath.Join(nix.store, "build1-nixos-vm", "bin", "run-feature-x-vm") {
		t.Fatalf("plan %+v", plan.Boot)
	}
	wantEnv := []string{"PATH=", "NIX_DISK_IMAGE=" + filepath.Join(l.Dir, "disk.qcow2"), "TMPDIR=" + filepath.Join(l.RunDir(), "tmp"), "USE_TMPDIR=1"}
	if strings.Join(s.Env, "\n") != strings.Join(wantEnv, "\n") {
		t.Errorf("run script env %q, want exactly %q", s.Env, wantEnv)
	}
	if s.Netdev != "user.0" || fmt.Sprint(s.Forwarded) != fmt.Sprint([]int{r.Ports.SSH, r.Ports.MCP}) {
		t.Errorf("run script netdev %q, forwarded %v; want user.0 and the SSH and MCP ports (its build forwards them)", s.Netdev, s.Forwarded)
	}
	if !plan.FixedShare {
		t.Error("plan: the share is not fixed")
	}
	// The build is a GC root through the VM directory's out-links.
	for i, want := range []string{filepath.Join(nix.store, "build1-nixos-vm"), filepath.Join(nix.store, "build1-launcher.json")} {
		if got, err := os.Readlink(GCRoots(l.Dir)[i]); err != nil || got != want {
			t.Errorf("out-link %s -> %q (%v), want %s", GCRoots(l.Dir)[i], got, err, want)
		}
	}
	if len(plan.Credentials) != 1 || plan.Credentials[0].Name != "agent-vm.ssh-host-key" || plan.Credentials[0].File != l.HostKey() {
		t.Errorf("credentials %+v", plan.Credentials)
	}

	// Unchanged inputs: no second build.
	if _, err := b.Prepare(context.Background(), l, r, backend.PrepareOptions{Share: driver.ShareVirtiofs}); err != nil {
		t.Fatal(err)
	}
	if nix.builds != 1 {
		t.Errorf("an unchanged VM was built again (%d builds)", nix.builds)
	}
	// Without its out-links the build is not protected from
	// nix-collect-garbage: build again, which makes them again.
	if err := RemoveGCRoots(l.Dir); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Prepare(context.Background(), l, r, backend.PrepareOptions{Share: driver.ShareVirtiofs}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Readlink(GCRoots(l.Dir)[0]); nix.builds != 2 || err != nil {
		t.Errorf("missing out-links: %d builds, link %v", nix.builds, err)
	}
	// A change that reaches vm.json (9p instead of virtiofs) rebuilds.
	fake.On("nix", nix.handler(t, "9p"))
	if _, err := b.Prepare(context.Background(), l, r, backend.PrepareOptions{Share: driver.Share9p}); err != nil {
		t.Fatal(err)
	}
	if nix.builds != 3 {
		t.Errorf("a changed vm.json did not rebuild (%d builds)", nix.builds)
	}
}

func TestPrepareFailuresSayWhatToDo(t *testing.T) {
	exe := staticBinary(t)
	l, r := testVM(t, "feature/x", "k")
	os.MkdirAll(l.RunDir(), 0o700)

	noNix := execxtest.New(t).Installed("nix", "")
	b := newTestBackend(t, noNix, exe)
	_, err := b.Prepare(context.Background(), l, r, backend.PrepareOptions{Share: driver.ShareVirtiofs})
	if err == nil || !strings.Contains(err.Error(), "install Nix") || !strings.Contains(err.Error(), "--backend qemu") {
		t.Errorf("without nix: %v", err)
	}

	old := execxtest.New(t)
	old.On("nix", (&fakeNix{version: "2.8.0"}).handler(t, "virtiofs"))
	_, err = newTestBackend(t, old, exe).Prepare(context.Background(), l, r, backend.PrepareOptions{Share: driver.ShareVirtiofs})
	if err == nil || !strings.Contains(err.Error(), "too old") {
		t.Errorf("old nix: %v", err)
	}

	failing := execxtest.New(t)
	failing.On("nix", (&fakeNix{version: "2.24.1", fail: "error: attribute 'foo' missing\n       at /home/me/vm-config.nix:3:5"}).handler(t, "virtiofs"))
	_, err = newTestBackend(t, failing, exe).Prepare(context.Background(), l, r, backend.PrepareOptions{Share: driver.ShareVirtiofs})
	if err == nil || !strings.Contains(err.Error(), "attribute 'foo' missing") || !strings.Contains(err.Error(), "nix build -f default.nix vm") {
		t.Errorf("failed build: %v", err)
	}
}

func TestDynamicBinaryIsRefusedForTheGuest(t *testing.T) {
	b := &Backend{Executable: func() (string, error) { return "/bin/true", nil }}
	if _, err := b.guestExecutable(); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("got %v", err)
	}
}
