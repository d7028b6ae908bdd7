package integration

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
)

// The run's template. A user's VMs start from a template after `agent-vm
// setup --template`: in seconds, with the agent CLIs installed. The run
// does the same for the scenarios whose checks are not about a VM's first
// boot from the base image (Scenario.Template): it builds one template of
// the default machine first, in a directory of its own that every
// agent-vm call of the run is given (AGENT_VM_TEMPLATE_DIR), so no
// template of the user's is used and none is left. Only the qemu backend's
// VMs start from templates; other runs build none. A cold first boot is
// still tested: the template's own build, agent-cli's builds, lifecycle's
// second boot and reset, and every vagrant and --host run.

// templateDirEnv names the directory agent-vm keeps its templates in.
const templateDirEnv = "AGENT_VM_TEMPLATE_DIR"

func templateScenario(agents string) Scenario {
	return Scenario{
		Name: "template",
		Summary: "the run's template, which the VMs of the scenarios after it start from: doctor says the package sources are reachable (pinned by setup " +
			"where this host's resolver needs it), template build --agents " + agents + " of the default machine (its installs through those pins), then template list shows it ready",
		NeedsVM:  true,
		Backends: []string{"qemu"},
		Verbs:    []string{"template", "doctor"},
		run:      func(ctx context.Context, s *S) { runTemplate(ctx, s, agents) },
	}
}

// runTemplate checks that the VMs' package sources are reachable, builds
// the run's template with agents ("none" or an agent's name) and checks
// that template list shows it. The default machine's policy has no net
// allow: where this host's resolver answers npm's registry with an address
// the egress proxy refuses (CI's gateway, 203.0.113.80), the build's npm
// install reaches it through the pin `agent-vm setup` recorded (README's
// test line runs setup first; the run changes no host setting itself).
func runTemplate(ctx context.Context, s *S, agents string) {
	var slug string
	s.Step(ctx, "doctor says the egress proxy reaches the package sources (pinned by setup where this host's resolver needs it)", func() error {
		d, err := s.doctorJSON(ctx, nil)
		if err != nil {
			return err
		}
		for _, c := range d.Checks {
			if c.Name == "egress" && !c.OK {
				return failf(s.lastResult(), "doctor's egress line: %s (hint: %s; README's test line runs `agent-vm setup --yes --tests` first)", c.Detail, c.Hint)
			}
		}
		if d.pinned("registry.npmjs.org") {
			s.notef("npm's registry pinned: this host's resolver answers it with an address the proxy refuses")
		}
		return nil
	})
	s.Step(ctx, "template build --agents "+agents+" saves the default machine", func() error {
		t := s.rep.begin("building the run's template")
		defer s.rep.end(t)
		res := s.call(ctx, call{args: []string{"template", "build", "--agents", agents}, onLine: func(l string) { s.rep.update(t, l) }})
		if err := want(res, 0); err != nil {
			return err
		}
		m := templateBuilt.FindStringSubmatch(res.Stdout)
		if m == nil {
			return failf(res, "template build did not say what it built")
		}
		slug = m[1]
		return nil
	})
	s.Step(ctx, "template list shows it ready, with the agents asked for", func() error {
		res, err := s.ok(ctx, "template", "list", "--json")
		if err != nil {
			return err
		}
		var ts []struct {
			Slug   string            `json:"slug"`
			Ready  bool              `json:"ready"`
			Agents map[string]string `json:"agents"`
		}
		if err := json.Unmarshal([]byte(res.Stdout), &ts); err != nil {
			return failf(res, "template list --json: %v", err)
		}
		for _, t := range ts {
			if t.Slug != slug || !t.Ready {
				continue
			}
			if agents != "none" && t.Agents[agents] == "" {
				return failf(res, "template %s has no %s", slug, agents)
			}
			s.notef("%s %s", slug, strings.TrimSpace(agents+" "+t.Agents[agents]))
			return nil
		}
		return failf(res, "template list does not show %s ready", slug)
	})
}

// withTemplate puts the run's template first among the selected
// scenarios when one of them asks for it and the run's VMs can start from
// one (backend is what create picks in this run); agents is the most any
// of them asks for.
func withTemplate(selected []Scenario, backend string) []Scenario {
	if backend != "qemu" || slices.ContainsFunc(selected, func(sc Scenario) bool { return sc.Name == "template" }) {
		return selected
	}
	agents := ""
	for _, sc := range selected {
		switch {
		case sc.Template == "":
		case agents == "" || agents == "none":
			agents = sc.Template
		}
	}
	if agents == "" {
		return selected
	}
	return append([]Scenario{templateScenario(agents)}, selected...)
}

// templateDir is the run's own template directory.
func templateDir(root string) string { return filepath.Join(root, "templates") }

// doctorPins is what the scenarios read of `agent-vm doctor --json`: its
// checks and the host's pins.
type doctorPins struct {
	Checks []doctorCheck `json:"checks"`
	Pins   []struct {
		Name string `json:"name"`
		Addr string `json:"addr"`
	} `json:"pins"`
}

// pinned says whether the host has a pin for name.
func (d doctorPins) pinned(name string) bool {
	for _, p := range d.Pins {
		if p.Name == name {
			return true
		}
	}
	return false
}

// doctorJSON runs `agent-vm doctor --json` with env added and reads it
// (doctor exits 1 when a check fails; its JSON still says what).
func (s *S) doctorJSON(ctx context.Context, env []string) (doctorPins, error) {
	res := s.call(ctx, call{args: []string{"doctor", "--json"}, env: env})
	var d doctorPins
	if err := json.Unmarshal([]byte(res.Stdout), &d); err != nil {
		return d, failf(res, "doctor --json: %v", err)
	}
	return d, nil
}
