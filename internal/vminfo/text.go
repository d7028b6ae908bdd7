package vminfo

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/size"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// WriteText writes what `status` prints of the VM for people: one
// "key:  value" line each, the next command to type where there is one.
func (i Info) WriteText(w io.Writer) {
	if i.Branch == "" {
		fmt.Fprintf(w, "vm:         %s\nstate:      %s\nreason:     %s\n", i.Slug, i.State, i.Error)
		return
	}
	fmt.Fprintf(w, "branch:     %s\n", i.Branch)
	if i.Host != "" {
		fmt.Fprintf(w, "vm:         %s (backend %s, on host %s)\n", i.Slug, i.Backend, i.Host)
	} else {
		fmt.Fprintf(w, "vm:         %s (backend %s)\n", i.Slug, i.Backend)
	}
	state := i.StateText()
	switch {
	case i.Pid != 0 && i.StartedAt != nil:
		state += fmt.Sprintf(", pid %d, up %s", i.Pid, time.Duration(i.UptimeSeconds)*time.Second)
	case i.Pid != 0: // paused in place
		state += fmt.Sprintf(", pid %d", i.Pid)
	}
	if i.Detail != "" {
		state += " (" + i.Detail + ")"
	}
	fmt.Fprintf(w, "state:      %s\n", state)
	if i.Accel != "" {
		fmt.Fprintf(w, "accel:      %s", i.Accel)
		if i.AccelReason != "" {
			fmt.Fprintf(w, " (%s)", i.AccelReason)
		}
		fmt.Fprintf(w, ", workspace over %s", i.Share)
		if i.Share == "virtiofs" {
			fmt.Fprintf(w, " (cache %s)", i.ShareCache)
		}
		fmt.Fprintln(w)
	}
	agent := i.Agent.State
	if i.Agent.Detail != "" {
		agent += " (" + termsafe.String(i.Agent.Detail) + ")" // the guest's /health answer
	}
	fmt.Fprintf(w, "agent:      %s\n", agent)
	if i.Foreign != "" {
		fmt.Fprintf(w, "vagrantfile: the repository's own, run as is: %s\n", termsafe.String(i.Foreign))
		fmt.Fprintf(w, "ssh:        ssh %s after `agent-vm ssh-config %s >> ~/.ssh/config`: vagrant's own ssh-config (vagrant's key; NO pinned host key, the guest is not agent-vm's)\n", i.SSH.Alias, i.Slug)
		fmt.Fprintf(w, "mcp:        none (the repository's Vagrantfile runs no agent-mcp)\n")
	} else {
		fmt.Fprintf(w, "ssh:        agent-vm shell %s, or ssh %s after `agent-vm ssh-config >> ~/.ssh/config` (127.0.0.1:%d, user %s)\n", i.Slug, i.SSH.Alias, i.SSH.Port, i.SSH.User)
		fmt.Fprintf(w, "mcp:        %s (health: %s)\n", i.MCP.URL, i.MCP.Health)
	}
	if i.MCP.Token != "" {
		fmt.Fprintf(w, "token:      %s (`agent-vm mcp-config %s` prints a client entry)\n", i.MCP.Token, i.Slug)
	}
	fmt.Fprintf(w, "forwards:   %s\n", forwardsLine(i))
	if i.Net != nil {
		fmt.Fprintf(w, "network:    %s\n", netLine(i))
		if len(i.Net.Browser) > 0 {
			fmt.Fprintf(w, "browser:    %s\n", strings.Join(i.Net.Browser, "; "))
		}
	}
	if len(i.Secrets) > 0 {
		fmt.Fprintf(w, "secrets:    %s (placeholders in the guest; the egress proxy adds the values)\n", strings.Join(i.Secrets, ", "))
	}
	if i.Paths.WorkspaceHost != "" {
		fmt.Fprintf(w, "workspace:  %s on host %s\n", i.Paths.Workspace, i.Paths.WorkspaceHost)
	} else {
		fmt.Fprintf(w, "workspace:  %s\n", i.Paths.Workspace)
	}
	fmt.Fprintf(w, "repo:       %s\n", termsafe.String(i.Git.Source))
	if i.Foreign != "" {
		fmt.Fprintf(w, "resources:  as the Vagrantfile says\n")
	} else {
		fmt.Fprintf(w, "resources:  %d CPUs, %s memory, %d GiB disk\n", i.Resources.CPUs, size.Human(i.Resources.MemoryMiB), i.Resources.DiskGiB)
	}
	fmt.Fprintf(w, "created:    %s\n", i.CreatedAt.Local().Format(time.RFC3339))
}

// StateText is the VM's state for people: a suspended VM's says how it
// keeps its memory ("suspended (paused)", "suspended (saved)").
func (i Info) StateText() string {
	if i.State == StateSuspended && i.Suspend != "" {
		return i.State + " (" + i.Suspend + ")"
	}
	return i.State
}

// netLine sums up the VM's egress policy and exposed host ports for status.
func netLine(i Info) string {
	n := i.Net
	if n.Uncontained != "" {
		return termsafe.String(n.Uncontained)
	}
	var parts []string
	list := "allow-list (the default)"
	if len(n.Added) > 0 {
		list = fmt.Sprintf("allow-list (the default and %s)", strings.Join(n.Added, ", "))
	}
	switch n.Mode {
	case egress.ModeAllow:
		parts = append(parts, list)
	case egress.ModeAsk:
		parts = append(parts, fmt.Sprintf("%s, other names asked about (%d pending)", list, n.Pending))
	default:
		parts = append(parts, n.Mode)
	}
	if len(n.Deny) > 0 {
		parts = append(parts, "refused: "+strings.Join(n.Deny, ", "))
	}
	var ports []string
	for _, x := range n.Exposed {
		ports = append(ports, strconv.Itoa(x.Port))
	}
	if len(ports) > 0 {
		parts = append(parts, "host ports exposed: "+strings.Join(ports, ", "))
	} else {
		parts = append(parts, "no host port exposed")
	}
	return termsafe.String(strings.Join(parts, "; ")) + fmt.Sprintf(" (`agent-vm net show %s`)", i.Slug)
}

// forwardsLine lists the VM's own port forwards for status.
func forwardsLine(i Info) string {
	if len(i.Forwards) == 0 {
		return fmt.Sprintf("none (agent-vm port add --vm %s PORT forwards a guest port)", i.Slug)
	}
	var out []string
	for _, f := range i.Forwards {
		out = append(out, fmt.Sprintf("guest %d -> 127.0.0.1:%d", f.Guest, f.Host))
	}
	return strings.Join(out, ", ")
}
