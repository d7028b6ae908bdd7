// Package sshconfig renders OpenSSH Host blocks for agent-vm's VMs (`agent-vm
// ssh-config`), so that `ssh agent-vm-<slug>` and editors' Remote-SSH reach
// them: with the VM's key and pinned host key for agent-vm's own guests,
// with the driver's endpoint for a foreign guest.
package sshconfig

import (
	"fmt"
	"strings"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Alias is the Host name ssh-config gives the VM called slug.
func Alias(slug string) string { return "agent-vm-" + slug }

// Blocks renders OpenSSH Host blocks for the VMs, so `ssh agent-vm-<slug>`
// and editors' Remote-SSH work with the pinned host key.
func Blocks(entries []state.Entry) string {
	var b strings.Builder
	for _, e := range entries {
		if e.Record == nil {
			fmt.Fprintf(&b, "# %s: skipped, %v\n\n", e.Slug, e.Err)
			continue
		}
		r, l := e.Record, e.Layout
		fmt.Fprintf(&b, "# agent-vm: branch %s\n", Comment(r.Branch))
		fmt.Fprintf(&b, "Host %s\n", Alias(r.Slug))
		fmt.Fprintf(&b, "  HostName 127.0.0.1\n")
		fmt.Fprintf(&b, "  Port %d\n", r.Ports.SSH)
		fmt.Fprintf(&b, "  User %s\n", r.Guest.User)
		fmt.Fprintf(&b, "  IdentityFile %s\n", quote(l.ClientKey()))
		fmt.Fprintf(&b, "  IdentitiesOnly yes\n")
		fmt.Fprintf(&b, "  UserKnownHostsFile %s\n", quote(l.KnownHosts()))
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

// quote quotes a path for ssh_config when it has spaces.
func quote(s string) string {
	if strings.ContainsAny(s, " \t\"") {
		return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
	}
	return s
}

// Comment keeps a branch name on one comment line.
func Comment(s string) string {
	return strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(s)
}

// Foreign is the Host block of a foreign guest (r's, the repository's own
// Vagrantfile), from its driver's endpoint: vagrant's key, and no pinned
// host key (said so).
func Foreign(r *state.Record, ep driver.SSHEndpoint) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# agent-vm: branch %s, the repository's own Vagrantfile (%s)\n", Comment(r.Branch), Comment(r.Guest.Foreign))
	fmt.Fprintf(&b, "# from `vagrant ssh-config`: vagrant's key, and NO pinned host key (the guest is not agent-vm's)\n")
	fmt.Fprintf(&b, "Host %s\n", Alias(r.Slug))
	fmt.Fprintf(&b, "  HostName %s\n", quote(ep.Host))
	fmt.Fprintf(&b, "  Port %d\n", ep.Port)
	fmt.Fprintf(&b, "  User %s\n", quote(ep.User))
	for _, f := range ep.IdentityFiles {
		fmt.Fprintf(&b, "  IdentityFile %s\n", quote(f))
	}
	for _, o := range ep.Options {
		fmt.Fprintf(&b, "  %s %s\n", o[0], o[1])
	}
	fmt.Fprintf(&b, "\n")
	return b.String()
}
