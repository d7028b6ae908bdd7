package libvirtbackend

import (
	"context"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/state"
)

// The flags of other backends are refused at create, each naming itself
// and the fix; bad package names too.
func TestCheckCreateRefusesOtherBackendsFlags(t *testing.T) {
	b := &Backend{}
	for _, tc := range []struct {
		f    backend.CreateFlags
		want string
	}{
		{backend.CreateFlags{Image: "/a.qcow2"}, "--image"},
		{backend.CreateFlags{Config: "m.nix"}, "--config and --nixpkgs"},
		{backend.CreateFlags{Nixpkgs: "/n"}, "--config and --nixpkgs"},
		{backend.CreateFlags{Box: "debian/bookworm64"}, "--box"},
		{backend.CreateFlags{Vagrantfile: "repo"}, "--vagrantfile"},
		{backend.CreateFlags{Packages: []string{"Bad Name"}}, "Bad Name"},
	} {
		err := b.CheckCreate(tc.f)
		if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.f.Packages == nil && !strings.Contains(err.Error(), "hint:")) {
			t.Errorf("%+v: %v", tc.f, err)
		}
	}
	if err := b.CheckCreate(backend.CreateFlags{Vagrantfile: "auto", Packages: []string{"ripgrep"}}); err != nil {
		t.Errorf("good flags refused: %v", err)
	}
}

// Reset forgets the image version the disk was made on and provisions
// again; with no base image to make a new disk from, it refuses and
// changes nothing.
func TestReset(t *testing.T) {
	r := &state.Record{Branch: "feat", Slug: "feat", Backend: Name}
	if err := r.SetSection(Settings{Image: "/cache/.store/debian-bookworm/v1", Provision: 1}); err != nil {
		t.Fatal(err)
	}
	err := (&Backend{ImageDir: t.TempDir()}).Reset(context.Background(), state.Layout{}, r)
	if err == nil || !strings.Contains(err.Error(), "no base image") || !strings.Contains(err.Error(), "the VM is unchanged") {
		t.Fatalf("reset without an image: %v", err)
	}
	if s, _ := state.SectionOf[Settings](r); s.Image == "" || s.Provision != 1 {
		t.Errorf("a refused reset changed the settings: %+v", s)
	}
	b := &Backend{ImageDir: t.TempDir()}
	withBuild := &Backend{ImageDir: t.TempDir()}
	withBuild.BuildImage = func(context.Context) (*image.Image, error) { return nil, nil }
	if err := withBuild.Reset(context.Background(), state.Layout{}, r); err != nil {
		t.Fatal(err)
	}
	if s, _ := state.SectionOf[Settings](r); s.Image != "" || s.Provision != 2 {
		t.Errorf("after reset: %+v", s)
	}
	if err := b.CheckStart(r, backend.StartFlags{Nixpkgs: "/n"}); err == nil || !strings.Contains(err.Error(), "--nixpkgs") {
		t.Errorf("--nixpkgs at start: %v", err)
	}
}
