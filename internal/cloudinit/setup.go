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
	gitConfig, err := gitHTTPSConfig(c.GitCredentials)
	if err != nil {
		return "", err
	}
	cmds := append(caCmds, script(string(env), "agent-vm-secret-env", placeholders), []string{"sh", "-c", string(git), "agent-vm-git-https", gitConfig})
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

// gitHTTPSConfig is the git configuration guest/git-https writes for the
// hosts of creds (each a host, with a port if any, and its token's
// placeholder), sorted: a remote of the host in ssh form goes over https,
// and git's credential helper for it answers the placeholder (an empty
// helper first drops any configured before). It is what `git config
// --add` wrote in the guest for the same settings, four processes a host
// under TCG; rendered here, a start writes it only when it changed.
func gitHTTPSConfig(creds map[string]string) (string, error) {
	var b strings.Builder
	for _, host := range slices.Sorted(maps.Keys(creds)) {
		if host == "" || strings.ContainsAny(host, "\n\x00\"\\/ ") {
			return "", fmt.Errorf("the git host %q (of a secret's upstream) cannot go in the guest's git configuration: it holds a quote, a backslash, a slash, a space or a line break (hint: bind the secret to an https URL with a plain host name)", host)
		}
		fmt.Fprintf(&b, "[url \"https://%s/\"]\n\tinsteadOf = %s\n\tinsteadOf = %s\n", host, gitValue("git@"+host+":"), gitValue("ssh://git@"+host+"/"))
		helper := `!f() { test "$1" = get && printf 'username=agent-vm\npassword=%s\n' ` + execx.ShellQuote(creds[host]) + `; }; f`
		fmt.Fprintf(&b, "[credential \"https://%s\"]\n\thelper =\n\thelper = %s\n", host, gitValue(helper))
	}
	return b.String(), nil
}

// gitValue quotes s as a value in a git configuration file.
func gitValue(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`).Replace(s) + `"`
}
