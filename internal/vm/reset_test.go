package vm_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// debianManager is the real orchestration with the qemu backend over an
// empty image cache (so: no base image), booting nothing.
func debianManager(t *testing.T) *vm.Manager {
	m := plainManager(t)
	m.Backends[debian.Name] = &debian.Backend{Run: execx.OS{}, Log: m.Log, ImageDir: t.TempDir()}
	m.HostCAs = func() ([]string, error) { return nil, nil }
	return m
}

// repoWithConfig is a repository whose commit holds .agent-vm/config.toml.
func repoWithConfig(t *testing.T, config string) string {
	repo := tu.Repo(t, true)
	tu.WriteFile(t, filepath.Join(repo, ".agent-vm", "config.toml"), config)
	tu.Git(t, repo, "add", ".")
	tu.Git(t, repo, "commit", "--quiet", "-m", "agent-vm settings")
	return repo
}

// create reads the repository's config.toml: its packages join the record
// beside --packages, its defaults fill the flags left out.
func TestCreateReadsTheRepositoryConfig(t *testing.T) {
	m := debianManager(t)
	repo := repoWithConfig(t, "packages = [\"hello\", \"jq\"]\ncpus = 1\nmemory = \"512M\"\nidle_suspend = \"45m\"\n")
	r, err := m.Create(context.Background(), vm.CreateOptions{Repo: repo, Branch: "feat", Backend: vm.BackendQEMU, Packages: []string{"ripgrep", "jq"}, MemoryMiB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Packages, []string{"ripgrep", "jq"}) || !slices.Equal(r.RepoPackages, []string{"hello", "jq"}) ||
		!slices.Equal(r.AllPackages(), []string{"ripgrep", "jq", "hello"}) {
		t.Errorf("packages %q, repo packages %q", r.Packages, r.RepoPackages)
	}
	if r.Resources.CPUs != 1 || r.Resources.MemoryMiB != 1024 {
		t.Errorf("resources %+v: want cpus 1 from the config, memory 1024 from the flag", r.Resources)
	}
	if r.IdleSuspend != "45m" {
		t.Errorf("idle_suspend %q, want the config's 45m", r.IdleSuspend)
	}
}

// A bad config.toml, or a package the backend cannot name, fails create
// naming the file and line, and leaves no VM.
func TestCreateRefusesABadRepositoryConfig(t *testing.T) {
	m := debianManager(t)
	for config, want := range map[string]string{
		"packages = [\n  \"jq\",\n  \"Bad_Name\",\n]\n": `feat:.agent-vm/config.toml:3: package name "Bad_Name" is not a Debian package name`,
		"cpus = 2\nmemroy = \"1G\"\n":                   `feat:.agent-vm/config.toml:2: unknown key "memroy"`,
		"memory = \"100M\"\n":                           "feat:.agent-vm/config.toml sets a default that does not fit: --memory 100 MiB is too small",
	} {
		_, err := m.Create(context.Background(), vm.CreateOptions{Repo: repoWithConfig(t, config), Branch: "feat", Backend: vm.BackendQEMU})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", config, err, want)
		}
	}
	if entries, _ := m.List(context.Background()); len(entries) != 0 {
		t.Errorf("a refused create left %d VMs", len(entries))
	}
}

// reset's failure paths: an unknown VM, a running one (without --force), a
// base image that is gone; none touches the VM.
func TestResetRefuses(t *testing.T) {
	m := debianManager(t)
	ctx := context.Background()
	if _, err := m.Reset(ctx, "nope", vm.ResetOptions{}); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("reset of an unknown VM: %v", err)
	}

	fake := startFakeVM(t, m, "running", false)
	_, err := m.Reset(ctx, "running", vm.ResetOptions{})
	if err == nil || !strings.Contains(err.Error(), "`agent-vm stop running` first, or `agent-vm reset --force running`") {
		t.Errorf("reset of a running VM: %v", err)
	}
	if !qemu.Running(fake.Mach, fake.Launch.QEMUPid) {
		t.Error("a refused reset stopped the VM")
	}

	repo := tu.Repo(t, true)
	if _, err := m.Create(ctx, vm.CreateOptions{Repo: repo, Branch: "stopped", Backend: vm.BackendQEMU}); err != nil {
		t.Fatal(err)
	}
	e, _ := m.Find(ctx, "stopped")
	disk := filepath.Join(e.Layout.Dir, debian.DiskFile)
	tu.WriteFile(t, disk, "the old disk")
	_, err = m.Reset(ctx, "stopped", vm.ResetOptions{})
	if err == nil || !strings.Contains(err.Error(), "no base image") || !strings.Contains(err.Error(), "the VM is unchanged") {
		t.Errorf("reset without a base image: %v", err)
	}
	if b, _ := os.ReadFile(disk); string(b) != "the old disk" {
		t.Error("a refused reset touched the disk")
	}
}
