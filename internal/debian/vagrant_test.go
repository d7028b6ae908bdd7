package debian

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vagrant"
)

func TestVagrantProvision(t *testing.T) {
	staging, final := state.Layout{Dir: t.TempDir()}, state.Layout{Dir: "/final/feat"}
	for _, d := range []string{staging.RunDir(), staging.Workspace()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	r := &state.Record{ID: "0123abcd-aaaa", Branch: "feat", Slug: "feat", VMName: "agent-vm-feat", Backend: VagrantName,
		Resources: state.Resources{CPUs: 2, MemoryMiB: 2048}, Guest: state.Guest{User: "dev"}, Paths: final.Paths()}
	r.Ports.SSH, r.Ports.MCP = 2201, 8001
	b := &VagrantBackend{}
	if err := b.Provision(context.Background(), staging, r, backend.CreateFlags{Box: "debian/bookworm64"}); err != nil {
		t.Fatal(err)
	}
	vf, err := os.ReadFile(filepath.Join(vagrant.Project(staging.RunDir()), "Vagrantfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`machine.vm.box = "debian/bookworm64"`, `"/final/feat/workspace", "/workspace"`, `host: 8001, host_ip: "127.0.0.1"`, `"/final/feat/seed.iso"`, `"` + MACOf(r.ID) + `"`} {
		if !strings.Contains(string(vf), want) {
			t.Errorf("the Vagrantfile lacks %s:\n%s", want, vf)
		}
	}
	if _, err := os.Stat(filepath.Join(staging.Workspace(), "Vagrantfile")); err == nil {
		t.Error("a Vagrantfile was written into the workspace")
	}

	// A repository with its own Vagrantfile is refused, not overwritten.
	if err := os.WriteFile(filepath.Join(staging.Workspace(), "Vagrantfile"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = b.Provision(context.Background(), staging, r, backend.CreateFlags{})
	if !errors.Is(err, ErrOwnVagrantfile) || !strings.Contains(err.Error(), "not supported yet") {
		t.Errorf("own Vagrantfile: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(staging.Workspace(), "Vagrantfile")); string(got) != "mine" {
		t.Errorf("the repository's Vagrantfile was changed: %q", got)
	}
}

func TestBoxFlagBelongsToVagrant(t *testing.T) {
	if err := (&Backend{}).CheckCreate(backend.CreateFlags{Box: "x/y"}); err == nil || !strings.Contains(err.Error(), "--backend vagrant") {
		t.Errorf("qemu backend with --box: %v", err)
	}
	if err := (&VagrantBackend{}).CheckCreate(backend.CreateFlags{Box: "x\ny"}); err == nil || !strings.Contains(err.Error(), "--box") {
		t.Errorf("a box name with a newline: %v", err)
	}
	if err := (&VagrantBackend{}).CheckCreate(backend.CreateFlags{Image: "/a.qcow2"}); err == nil {
		t.Error("vagrant backend took --image")
	}
	if MACOf("a") == MACOf("b") || !strings.HasPrefix(MACOf("a"), "52:54:00:") {
		t.Errorf("MACs: %s %s", MACOf("a"), MACOf("b"))
	}
}
