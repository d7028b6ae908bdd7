package cloudinit

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// Setup renders the root script every start runs in the guest once it
// answers SSH (backend.Plan.Setup): the guest trusts cas (the host's
// added CAs and the VM's own proxy CA, by guest/ca-certs, which changes
// nothing when they are in place already) and every login, command and
// session gets placeholders (by guest/secret-env). The seed's bootcmd
// does the former on a first boot only; later boots skip cloud-init, and
// a clone restored from a template holds the template's trust. Neither
// argument holds a secret.
func Setup(cas []string, placeholders map[string]string) (string, error) {
	if len(cas) == 0 && len(placeholders) == 0 {
		return "", nil
	}
	var b strings.Builder
	b.WriteString("set -eu\n")
	caCmds, err := caCertsCommand(cas)
	if err != nil {
		return "", err
	}
	env, err := guestFS.ReadFile("guest/secret-env")
	if err != nil {
		return "", fmt.Errorf("internal error: embedded guest file: %w", err)
	}
	cmd := []string{"sh", "-c", string(env), "agent-vm-secret-env"}
	for _, name := range slices.Sorted(maps.Keys(placeholders)) {
		cmd = append(cmd, name+"="+placeholders[name])
	}
	for _, c := range append(caCmds, cmd) {
		q := make([]string, len(c))
		for i, a := range c {
			q[i] = execx.ShellQuote(a)
		}
		b.WriteString(strings.Join(q, " ") + "\n")
	}
	return b.String(), nil
}
