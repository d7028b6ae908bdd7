package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// TestRepositoryVagrantfile runs the real command line, real git and the
// real vagrant (no libvirtd needed: nothing is brought up) on a repository
// with its own Vagrantfile: create uses it as is and says what it loses,
// status, list and mcp-config say so, destroy removes the VM, and neither
// the Vagrantfile nor the repository's own .vagrant/ is touched. A
// Vagrantfile of several machines, or a directory, is refused, and
// --vagrantfile=generate takes agent-vm's own.
func TestRepositoryVagrantfile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs vagrant about ten times (seconds each)")
	}
	tu.Program(t, "vagrant")
	repo := tu.Repo(t, true)
	vf := filepath.Join(repo, "Vagrantfile")
	tu.WriteFile(t, vf, "Vagrant.configure(\"2\") do |config|\n  config.vm.box = \"debian/bookworm64\"\nend\n")
	tu.WriteFile(t, filepath.Join(repo, ".gitignore"), ".vagrant/\n")
	tu.Git(t, repo, "add", ".")
	tu.Git(t, repo, "commit", "--quiet", "-m", "vagrant")
	tu.Git(t, repo, "push", "--quiet", "origin", "main")
	userID := filepath.Join(repo, ".vagrant", "machines", "default", "libvirt", "id")
	tu.WriteFile(t, userID, "the user's own machine\n")
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, p := range []string{vf, userID} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	unchanged := func(when string) {
		t.Helper()
		for p, want := range map[string]string{vf: "Vagrant.configure(\"2\") do |config|\n  config.vm.box = \"debian/bookworm64\"\nend\n", userID: "the user's own machine\n"} {
			b, err := os.ReadFile(p)
			fi, serr := os.Stat(p)
			if err != nil || serr != nil || string(b) != want || !fi.ModTime().Equal(old) {
				t.Errorf("%s: %s changed: %q, %v", when, p, b, err)
			}
		}
		if entries, _ := os.ReadDir(filepath.Join(repo, ".vagrant", "machines")); len(entries) != 1 {
			t.Errorf("%s: the repository's .vagrant/machines changed: %v", when, entries)
		}
	}
	st := t.TempDir()
	env := map[string]string{"AGENT_VM_VAGRANT_HOME": filepath.Join(t.TempDir(), "vagrant-home")}
	run := func(args ...string) result { t.Helper(); return agentVMEnv(t, repo, st, env, args...) }

	r := run("create", "--backend", "vagrant", "--branch", "feat")
	if r.code != 0 {
		t.Fatalf("create: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"runs as is: " + vf + ", the repository's own, never changed", "agent-mcp", "pinned host key", "port choice", "workspace share", "network containment", "--vagrantfile=generate"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("create does not say %q:\n%s", want, r.stdout)
		}
	}
	unchanged("after create")
	if fi, err := os.Stat(filepath.Join(env["AGENT_VM_VAGRANT_HOME"])); err != nil || !fi.IsDir() {
		t.Errorf("vagrant did not run with agent-vm's VAGRANT_HOME: %v", err)
	}

	js := statusJSON(t, st, "feat")
	if js["foreign"] != vf || js["backend"] != "vagrant" || js["state"] != "stopped" {
		t.Errorf("status --json: foreign %v, backend %v, state %v", js["foreign"], js["backend"], js["state"])
	}
	if p := js["ports"].(map[string]any); p["ssh"] != 0.0 || p["mcp"] != 0.0 {
		t.Errorf("status --json shows ports the VM does not have: %v", p)
	}
	r = run("status", "feat")
	if !strings.Contains(r.stdout, "NO pinned host key") || !strings.Contains(r.stdout, "vagrantfile: the repository's own") {
		t.Errorf("status:\n%s", r.stdout)
	}
	if r = run("list"); !strings.Contains(r.stdout, "vagrant (repo's Vagrantfile)") {
		t.Errorf("list:\n%s", r.stdout)
	}
	if r = run("mcp-config", "feat"); r.code == 0 || !strings.Contains(r.stderr, "runs no agent-mcp") {
		t.Errorf("mcp-config: %d %s", r.code, r.stderr)
	}
	if r = run("ssh-config", "feat"); r.code == 0 || !strings.Contains(r.stderr, "agent-vm start feat") {
		t.Errorf("ssh-config of a machine not up: %d %s", r.code, r.stderr)
	}
	if r = run("create", "--backend", "vagrant", "--branch", "other", "--port", "8123"); r.code == 0 || !strings.Contains(r.stderr, "--port") {
		t.Errorf("create --port with the repository's Vagrantfile: %d %s", r.code, r.stderr)
	}
	if r = run("create", "--backend", "vagrant", "--branch", "other", "--cpus", "1"); r.code == 0 || !strings.Contains(r.stderr, "--cpus does not apply") {
		t.Errorf("create --cpus with the repository's Vagrantfile: %d %s", r.code, r.stderr)
	}
	// destroy still checks the workspace for unsaved work.
	scratch := filepath.Join(st, "feat", "workspace", "scratch.txt")
	tu.WriteFile(t, scratch, "not saved anywhere\n")
	if r = run("destroy", "feat"); r.code == 0 || !strings.Contains(r.stderr+r.stdout, "scratch.txt") {
		t.Errorf("destroy with unsaved work in the workspace: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if err := os.Remove(scratch); err != nil {
		t.Fatal(err)
	}
	if r = run("destroy", "feat"); r.code != 0 {
		t.Fatalf("destroy: %d %s", r.code, r.stderr)
	}
	unchanged("after destroy")

	// Two machines: refused, naming them, and nothing is left.
	tu.WriteFile(t, vf, "Vagrant.configure(\"2\") do |c|\n  c.vm.box = \"b\"\n  c.vm.define \"web\", primary: true\n  c.vm.define \"db\"\nend\n")
	if r = run("create", "--backend", "vagrant", "--branch", "two"); r.code == 0 || !strings.Contains(r.stderr, "2 machines (web, db)") || !strings.Contains(r.stderr, "--vagrantfile=generate") {
		t.Errorf("two machines: %d %s", r.code, r.stderr)
	}
	if r = run("list", "--json"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("a refused create left a VM:\n%s", r.stdout)
	}
	// --vagrantfile=generate: agent-vm's own, whatever the repository has.
	if r = run("create", "--backend", "vagrant", "--branch", "gen", "--vagrantfile=generate"); r.code != 0 || strings.Contains(r.stdout, "vagrantfile:") {
		t.Errorf("--vagrantfile=generate: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if js := statusJSON(t, st, "gen"); js["foreign"] != "" {
		t.Errorf("generate recorded a foreign guest: %v", js["foreign"])
	}

	// A directory named Vagrantfile.
	if err := os.Remove(vf); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(vf, 0o755); err != nil {
		t.Fatal(err)
	}
	if r = run("create", "--backend", "vagrant", "--branch", "dir"); r.code == 0 || !strings.Contains(r.stderr, "is a directory") {
		t.Errorf("a directory named Vagrantfile: %d %s", r.code, r.stderr)
	}
	if r = run("create", "--backend", "qemu", "--branch", "q", "--vagrantfile=repo"); r.code == 0 || !strings.Contains(r.stderr, "--backend vagrant") {
		t.Errorf("--vagrantfile=repo with the qemu backend: %d %s", r.code, r.stderr)
	}
}
