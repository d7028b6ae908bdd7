package seed

import (
	"runtime"
	"strings"
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

// A VM's agent CLI is installed at agent-vm's pinned version, unless its
// template's guest has that agent; a template installs its own at theirs.
// Claude Code at an exact version is its program's package for this CPU
// alone (not the musl one as well, nor the package that copies it); at a
// dist-tag npm chooses.
func TestAgentPackages(t *testing.T) {
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	if arch == "" {
		// Skip, not SkipOrFail: nothing is missing here; the test's cases
		// are those of the CPUs Node names, and this is none of them.
		t.Skip("Node has no name for " + runtime.GOARCH)
	}
	claude := "@anthropic-ai/claude-code-linux-" + arch + "@2.1.332" // its program's package alone
	for _, c := range []struct {
		r              state.Record
		have           []string
		want, programs string
	}{
		{state.Record{}, nil, "", ""},
		{state.Record{Agent: "claude"}, nil, "", claude},
		{state.Record{Agent: "claude"}, []string{"claude"}, "", ""},
		{state.Record{Agent: "codex"}, []string{"claude"}, "@openai/codex@0.171.0", ""},
		{state.Record{Agents: []string{"claude@2.1.332", "gemini@latest"}}, nil, "@google/gemini-cli@latest", claude},
		{state.Record{Agents: []string{"claude@latest"}}, nil, "@anthropic-ai/claude-code@latest", ""},
	} {
		specs, programs := AgentPackages(&c.r, c.have)
		if got, gotPrograms := strings.Join(specs, " "), strings.Join(programs, " "); got != c.want || gotPrograms != c.programs {
			t.Errorf("AgentPackages(agent %q, agents %q, template has %q) = %q and programs %q, want %q and %q", c.r.Agent, c.r.Agents, c.have, got, gotPrograms, c.want, c.programs)
		}
	}
}

// Each VM's MAC is its own, stable, and QEMU's.
func TestMACOf(t *testing.T) {
	if MACOf("a") == MACOf("b") || MACOf("a") != MACOf("a") || !strings.HasPrefix(MACOf("a"), "52:54:00:") {
		t.Errorf("MACs: %s %s", MACOf("a"), MACOf("b"))
	}
}
