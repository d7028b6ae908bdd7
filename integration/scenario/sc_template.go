package scenario

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/agent-vm/agent-vm/integration/harness"
)

// Template builds the run's template (the harness's template.go
// says when and why) with agents: Suite.Template.
func Template(agents string) harness.Scenario {
	return harness.Scenario{
		Name: "template",
		Summary: "the run's template, which the VMs of the scenarios after it start from: doctor says the package sources are reachable (pinned by setup " +
			"where this host's resolver needs it), template build --agents " + agents + " of the default machine (its installs through those pins), then template list shows it ready",
		NeedsVM:  true,
		Backends: []string{"qemu"},
		Verbs:    []string{"template", "doctor"},
		Run:      func(ctx context.Context, s *harness.S) { runTemplate(ctx, s, agents) },
	}
}

// runTemplate checks that the VMs' package sources are reachable, builds
// the run's template with agents ("none" or an agent's name) and checks
// that template list shows it. The default machine's policy has no net
// allow: where this host's resolver answers npm's registry with an address
// the egress proxy refuses (CI's gateway, 203.0.113.80), the build's npm
// install reaches it through the pin `agent-vm setup` recorded (README's
// test line runs setup first; the run changes no host setting itself).
func runTemplate(ctx context.Context, s *harness.S, agents string) {
	var slug string
	s.Step(ctx, "doctor says the egress proxy reaches the package sources (pinned by setup where this host's resolver needs it)", func() error {
		d, err := doctorJSON(ctx, s, nil)
		if err != nil {
			return err
		}
		for _, c := range d.Checks {
			if c.Name == "egress" && !c.OK {
				return harness.Failf(s.LastResult(), "doctor's egress line: %s (hint: %s; README's test line runs `agent-vm setup --yes --tests` first)", c.Detail, c.Hint)
			}
		}
		if d.pinned("registry.npmjs.org") {
			s.Notef("npm's registry pinned: this host's resolver answers it with an address the proxy refuses")
		}
		return nil
	})
	s.Step(ctx, "template build --agents "+agents+" saves the default machine", func() error {
		res := s.CallShowing(ctx, "building the run's template", harness.Call{Args: []string{"template", "build", "--agents", agents}})
		if err := harness.Want(res, 0); err != nil {
			return err
		}
		m := templateBuilt.FindStringSubmatch(res.Stdout)
		if m == nil {
			return harness.Failf(res, "template build did not say what it built")
		}
		slug = m[1]
		return nil
	})
	s.Step(ctx, "template list shows it ready, with the agents asked for", func() error {
		res, err := s.OK(ctx, "template", "list", "--json")
		if err != nil {
			return err
		}
		var ts []struct {
			Slug   string            `json:"slug"`
			Ready  bool              `json:"ready"`
			Agents map[string]string `json:"agents"`
		}
		if err := json.Unmarshal([]byte(res.Stdout), &ts); err != nil {
			return harness.Failf(res, "template list --json: %v", err)
		}
		for _, t := range ts {
			if t.Slug != slug || !t.Ready {
				continue
			}
			if agents != "none" && t.Agents[agents] == "" {
				return harness.Failf(res, "template %s has no %s", slug, agents)
			}
			s.Notef("%s %s", slug, strings.TrimSpace(agents+" "+t.Agents[agents]))
			return nil
		}
		return harness.Failf(res, "template list does not show %s ready", slug)
	})
}

// doctorPins is what the scenarios read of `agent-vm doctor --json`: its
// checks and the host's pins.
type doctorPins struct {
	Checks []harness.DoctorCheck `json:"checks"`
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
func doctorJSON(ctx context.Context, s *harness.S, env []string) (doctorPins, error) {
	res := s.Call(ctx, harness.Call{Args: []string{"doctor", "--json"}, Env: env})
	var d doctorPins
	if err := json.Unmarshal([]byte(res.Stdout), &d); err != nil {
		return d, harness.Failf(res, "doctor --json: %v", err)
	}
	return d, nil
}
