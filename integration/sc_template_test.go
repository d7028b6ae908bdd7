package integration

import (
	"slices"
	"strings"
	"testing"
)

// The run's template comes first when a selected scenario may start from
// it, holding the most any of them asks for, and only where VMs start from
// templates (the qemu backend).
func TestWithTemplate(t *testing.T) {
	byName := func(ns ...string) []Scenario {
		var out []Scenario
		for _, sc := range Scenarios() {
			if slices.Contains(ns, sc.Name) {
				out = append(out, sc)
			}
		}
		return out
	}
	for _, c := range []struct {
		names   []string
		backend string
		want    []string
		summary string // the template scenario's agents, in its summary
	}{
		{[]string{"cli"}, "qemu", []string{"cli"}, ""},
		{[]string{"lifecycle", "mcp"}, "qemu", []string{"template", "lifecycle", "mcp"}, "--agents none "},
		{[]string{"several", "agent-cli"}, "qemu", []string{"template", "several", "agent-cli"}, "--agents claude "},
		{[]string{"lifecycle", "mcp"}, "vagrant", []string{"lifecycle", "mcp"}, ""},
		{[]string{"lifecycle"}, "libvirt", []string{"lifecycle"}, ""},
		{[]string{"template", "cli"}, "qemu", []string{"template", "cli"}, "--agents claude "},
	} {
		got := withTemplate(byName(c.names...), c.backend)
		if n := names(got); !slices.Equal(n, c.want) {
			t.Errorf("%v with %s: got %v, want %v", c.names, c.backend, n, c.want)
			continue
		}
		if c.summary != "" && !strings.Contains(got[0].Summary, c.summary) {
			t.Errorf("%v with %s: the template scenario says %q, want it to build with %q", c.names, c.backend, got[0].Summary, c.summary)
		}
	}
}
