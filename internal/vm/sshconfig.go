package vm

import (
	"context"
	"fmt"
	"strings"

	"github.com/agent-vm/agent-vm/internal/state"
)

// SSHConfigFor is `ssh-config [BRANCH]`: the Host block of the VM name
// means, or of every VM when name is "".
func (m *Manager) SSHConfigFor(ctx context.Context, name string) (string, error) {
	if name == "" {
		all, err := m.List(ctx)
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, e := range all {
			if e.Record == nil || e.Record.Guest.Foreign == "" {
				b.WriteString(SSHConfig([]state.Entry{e}))
				continue
			}
			block, err := m.foreignSSHConfig(ctx, e)
			if err != nil {
				block = fmt.Sprintf("# %s: skipped, %s\n\n", e.Slug, sshComment(err.Error()))
			}
			b.WriteString(block)
		}
		return b.String(), nil
	}
	e, err := m.findRecorded(ctx, name)
	if err != nil {
		return "", err
	}
	if e.Record.Guest.Foreign != "" {
		return m.foreignSSHConfig(ctx, e)
	}
	return SSHConfig([]state.Entry{e}), nil
}

// SSHConfig renders OpenSSH Host blocks for the VMs, so `ssh agent-vm-<slug>`
// and editors' Remote-SSH work with the pinned host key.
func SSHConfig(entries []state.Entry) string {
	var b strings.Builder
	for _, e := range entries {
		if e.Record == nil {
			fmt.Fprintf(&b, "# %s: skipped, %v\n\n", e.Slug, e.Err)
			continue
		}
		r, l := e.Record, e.Layout
		fmt.Fprintf(&b, "# agent-vm: branch %s\n", sshComment(r.Branch))
		fmt.Fprintf(&b, "Host %s\n", SSHAlias(r.Slug))
		fmt.Fprintf(&b, "  HostName 127.0.0.1\n")
		fmt.Fprintf(&b, "  Port %d\n", r.Ports.SSH)
		fmt.Fprintf(&b, "  User %s\n", r.Guest.User)
		fmt.Fprintf(&b, "  IdentityFile %s\n", sshQuote(l.ClientKey()))
		fmt.Fprintf(&b, "  IdentitiesOnly yes\n")
		fmt.Fprintf(&b, "  UserKnownHostsFile %s\n", sshQuote(l.KnownHosts()))
		fmt.Fprintf(&b, "  StrictHostKeyChecking yes\n")
		fmt.Fprintf(&b, "  HostKeyAlgorithms ssh-ed25519\n")
		for _, f := range r.Forwards {
			// Not a LocalForward: QEMU binds the host port while the VM
			// runs, so ssh could not bind it too.
			fmt.Fprintf(&b, "  # guest port %d: on 127.0.0.1:%d while the VM runs, forwarded by QEMU (`agent-vm port`), not by ssh\n", f.Guest, f.Host)
		}
		fmt.Fprintf(&b, "\n")
	}
	return b.String()
}

// sshQuote quotes a path for ssh_config when it has spaces.
func sshQuote(s string) string {
	if strings.ContainsAny(s, " \t\"") {
		return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
	}
	return s
}

// sshComment keeps a branch name on one comment line.
func sshComment(s string) string {
	return strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(s)
}
