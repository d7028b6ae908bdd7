package harness

import (
	"path/filepath"
	"slices"
)

// The run's template. A user's VMs start from a template after `agent-vm
// setup --template`: in seconds, with the agent CLIs installed. The run
// does the same for the scenarios whose checks are not about a VM's first
// boot from the base image (Scenario.Template): it builds one template of
// the default machine first (Suite.Template), in a directory of its own
// that every agent-vm call of the run is given (AGENT_VM_TEMPLATE_DIR), so
// no template of the user's is used and none is left. Only the qemu
// backend's VMs start from templates; other runs build none. A cold boot
// is still tested: the template's own build and agent-cli's rebuild (a
// first boot each), lifecycle's second boot (its restart after the kill:
// its reset's start is a first start, from the template), and every
// vagrant and --host run.

// templateDirEnv names the directory agent-vm keeps its templates in.
const templateDirEnv = "AGENT_VM_TEMPLATE_DIR"

// withTemplate puts the run's template (made by template) first among the
// selected scenarios when one of them asks for it and the run's VMs can
// start from one (backend is what create picks in this run); agents is the
// most any of them asks for.
func withTemplate(selected []Scenario, backend string, template func(agents string) Scenario) []Scenario {
	name := template("none").Name
	if backend != "qemu" || slices.ContainsFunc(selected, func(sc Scenario) bool { return sc.Name == name }) {
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
	return append([]Scenario{template(agents)}, selected...)
}

// templateDir is the run's own template directory.
func templateDir(root string) string { return filepath.Join(root, "templates") }
