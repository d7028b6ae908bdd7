package nixos

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/modules"
)

// Package names become pkgs.<name> in the guest module: anything but a
// plain attribute name is refused, naming it.
func TestPackagesMustBeAttributeNames(t *testing.T) {
	b := &Backend{}
	if err := b.CheckCreate(backend.CreateFlags{Packages: []string{"ripgrep", "python3", "gcc_13", "nodejs-slim", "hello'"}}); err != nil {
		t.Errorf("attribute names refused: %v", err)
	}
	for _, bad := range []string{"g++", "python3Packages.requests", "1password", "-jq", "${x}", `"jq"`, ""} {
		err := b.CheckCreate(backend.CreateFlags{Packages: []string{"jq", bad}})
		if err == nil || !strings.Contains(err.Error(), `"`+strings.ReplaceAll(bad, `"`, `\"`)+`" is not a nixpkgs attribute name`) {
			t.Errorf("%q: got %v", bad, err)
		}
	}
	// The renderer checks again what reaches vm.json.
	l, r := testVM(t, "feat", "ssh-ed25519 AAAA")
	r.Packages = []string{"g++"}
	if _, err := newVMJSON(l, r, "/nix/store/x-source", "virtiofs", ""); err == nil || !strings.Contains(err.Error(), `"g++"`) {
		t.Errorf("newVMJSON with g++: %v", err)
	}
}

// vm.json carries the record's packages, both kinds once each, and the
// provisioning script is written beside the modules that use it, inside
// what decides whether to build again.
func TestPackagesAndScriptReachTheBuild(t *testing.T) {
	l, r := testVM(t, "feat", "ssh-ed25519 AAAA")
	r.Packages, r.RepoPackages = []string{"jq", "hello"}, []string{"hello", "ripgrep"}
	v, err := newVMJSON(l, r, "/nix/store/x-source", "virtiofs", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(v.Packages, " "); got != "jq hello ripgrep" {
		t.Errorf("packages %q", got)
	}
	if err := writeFiles(l.Dir, v); err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(l.Dir, ModulesDir, modules.ProvisionFile))
	if err != nil || string(script) != string(modules.Provision()) {
		t.Fatalf("the provisioning script beside the modules: %v", err)
	}
	before, err := inputsHash(l.Dir, r)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(l.Dir, ModulesDir, modules.ProvisionFile), []byte("#!/bin/sh\n"), 0o644)
	if after, _ := inputsHash(l.Dir, r); after == before {
		t.Error("a changed provisioning script does not change the build's inputs")
	}
}

// Reset removes the root disk image (and only that): qemu-vm makes a new
// one at the next boot.
func TestResetRemovesTheDiskImage(t *testing.T) {
	l, r := testVM(t, "feat", "ssh-ed25519 AAAA")
	disk := filepath.Join(l.Dir, DiskImage)
	os.WriteFile(disk, []byte("x"), 0o600)
	os.WriteFile(l.HostKey(), []byte("key"), 0o600)
	os.MkdirAll(l.Workspace(), 0o755)
	os.WriteFile(filepath.Join(l.Workspace(), "work.txt"), []byte("x"), 0o644)
	b := &Backend{}
	for i := 0; i < 2; i++ { // a second reset, with no disk, is no error
		if err := b.Reset(context.Background(), l, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(disk); !os.IsNotExist(err) {
		t.Errorf("the disk image is still there: %v", err)
	}
	for _, keep := range []string{filepath.Join(l.Workspace(), "work.txt"), l.HostKey(), l.ClientKey()} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("reset removed %s: %v", keep, err)
		}
	}
}
