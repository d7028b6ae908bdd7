package seed

import (
	"testing"

	"github.com/agent-vm/agent-vm/internal/state"
)

type settings struct {
	Image     string `json:"image,omitempty"`
	Provision int    `json:"provision"`
}

// start --reprovision counts one more provisioning in the backend's
// section (a new instance-id), and stores it; a plain start reads it.
func TestForStartCountsReprovisioning(t *testing.T) {
	r := &state.Record{}
	if err := r.SetSection(settings{Image: "/a", Provision: 2}); err != nil {
		t.Fatal(err)
	}
	count := func(s *settings) *int { return &s.Provision }
	s, err := ForStart(r, false, count)
	if err != nil || s.Provision != 2 || s.Image != "/a" {
		t.Fatalf("plain start: %+v, %v", s, err)
	}
	if s, err = ForStart(r, true, count); err != nil || s.Provision != 3 {
		t.Fatalf("--reprovision: %+v, %v", s, err)
	}
	if stored, _ := state.SectionOf[settings](r); stored.Provision != 3 || stored.Image != "/a" {
		t.Errorf("the record's section after --reprovision: %+v, want provision 3 and the image kept", stored)
	}
}
