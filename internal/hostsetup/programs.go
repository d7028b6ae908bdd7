package hostsetup

import (
	"fmt"

	"github.com/agent-vm/agent-vm/internal/hostpkgs"
)

// ProgramCheck is one host program `setup --check` looked for.
type ProgramCheck struct {
	Name string `json:"name"`
	Path string `json:"path"` // "" when missing
	Hint string `json:"hint"` // the package that has it
}

// CheckPrograms looks for every program need names on host, changing
// nothing. The error names the missing ones, with the setup command that
// installs them: tests adds --tests, backend (a backend that needs more
// than every VM's programs; "" for none) --backend.
func CheckPrograms(host hostpkgs.Host, need hostpkgs.Need, tests bool, backend string) ([]ProgramCheck, error) {
	var out []ProgramCheck
	var missing []hostpkgs.Program
	for _, p := range hostpkgs.For(need) {
		path, ok := host.Find(p)
		if !ok {
			missing = append(missing, p)
		}
		out = append(out, ProgramCheck{Name: p.Name, Path: path, Hint: p.PackageHint()})
	}
	if len(missing) > 0 {
		flag := ""
		if tests {
			flag = " --tests"
		}
		if backend != "" {
			flag += " --backend " + backend
		}
		return out, fmt.Errorf("this host lacks %s (hint: run `agent-vm setup%s` as root)", hostpkgs.Names(missing), flag)
	}
	return out, nil
}
