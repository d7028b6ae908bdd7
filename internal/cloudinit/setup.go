package cloudinit

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// SetupConfig is what every start hands the guest (Setup). None of it
// is a secret.
type SetupConfig struct {
	// CACerts: the host's added CAs and the VM's own proxy CA.
	CACerts []string
	// Placeholders: each secret's name and its placeholder.
	Placeholders map[string]string
	// GitCredentials: git hosts (https) and the placeholder of each one's
	// token.
	GitCredentials map[string]string
}

// Setup renders the root script every start runs in the guest once it
// answers SSH (backend.Plan.Setup): the guest trusts c.CACerts (by
// guest/ca-certs, which changes nothing when they are in place already),
// every login, command and session gets c.Placeholders (guest/secret-env)
// and git reaches the hosts of c.GitCredentials over https with their
// placeholders (guest/git-https). The seed's bootcmd trusts the CAs on a
// first boot only; later boots skip cloud-init, and a clone restored from
// a template holds the template's trust.
func Setup(c SetupConfig) (string, error) {
	cas, placeholders := c.CACerts, c.Placeholders
	if len(cas) == 0 && len(placeholders) == 0 && len(c.GitCredentials) == 0 {
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
	git, err := guestFS.ReadFile("guest/git-https")
	if err != nil {
		return "", fmt.Errorf("internal error: embedded guest file: %w", err)
	}
	cmds := append(caCmds, script(string(env), "agent-vm-secret-env", placeholders), script(string(git), "agent-vm-git-https", c.GitCredentials))
	for _, c := range cmds {
		q := make([]string, len(c))
		for i, a := range c {
			q[i] = execx.ShellQuote(a)
		}
		b.WriteString(strings.Join(q, " ") + "\n")
	}
	return b.String(), nil
}

// script is the command that runs a guest script with the arguments
// KEY=VALUE of kv, sorted.
func script(text, name string, kv map[string]string) []string {
	cmd := []string{"sh", "-c", text, name}
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		cmd = append(cmd, k+"="+kv[k])
	}
	return cmd
}
