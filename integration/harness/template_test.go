package harness

import (
	"slices"
	"strings"
	"testing"
)

// suite is a stand-in for the binary's scenarios: their names, in their
// order, and the templates they may start from.
func suite() Suite {
	template := func(agents string) Scenario {
		return Scenario{Name: "template", Summary: "template build --agents " + agents + " "}
	}
	return Suite{
		Scenarios: []Scenario{
			template("claude"), {Name: "cli"}, {Name: "lifecycle", Template: "none"}, {Name: "several", Template: "none"},
			{Name: "mcp", Template: "none"}, {Name: "sessions", Template: "none"}, {Name: "agent-cli", Template: "claude"},
		},
		Template: template,
	}
}

// The run's template comes first when a selected scenario may start from
// it, holding the most any of them asks for, and only where VMs start from
// templates (the qemu backend).
func TestWithTemplate(t *testing.T) {
	su := suite()
	byName := func(ns ...string) []Scenario {
		var out []Scenario
		for _, sc := range su.Scenarios {
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
		got := withTemplate(byName(c.names...), c.backend, su.Template)
		if n := names(got); !slices.Equal(n, c.want) {
			t.Errorf("%v with %s: got %v, want %v", c.names, c.backend, n, c.want)
			continue
		}
		if c.summary != "" && !strings.Contains(got[0].Summary, c.summary) {
			t.Errorf("%v with %s: the template scenario says %q, want it to build with %q", c.names, c.backend, got[0].Summary, c.summary)
		}
	}
}
