package browser

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/mcpconfig"
	"github.com/agent-vm/agent-vm/internal/mcpsync"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// devToolsMCP installs chrome-devtools-mcp in e's guest unless it is there
// (guest.DevToolsMCP's Install: once per guest, through the VM's egress
// proxy, from the npm registry) and registers it with the guest's Claude
// Code (the workspace's local scope, as mcp sync writes), pointed at the
// DevTools relay.
func devToolsMCP(ctx context.Context, vms VMs, e state.Entry, notify func(string)) error {
	d, err := guest.NewDevToolsMCP(guest.DevToolsMCPPrefix, runtime.GOARCH) // the guest's architecture is the host's
	if err != nil {
		return err
	}
	c, _, err := vms.Connect(ctx, e.Slug)
	if err != nil {
		return err
	}
	defer c.Close()
	notify(fmt.Sprintf("making sure %s %s is installed in the VM (the first time, it and Node.js %s come from the npm registry: about 50 MB)",
		guest.DevToolsMCPPackage, guest.DevToolsMCPVersion, guest.DevToolsNodeVersion))
	var out, errOut strings.Builder
	began := time.Now()
	code, err := sshx.Run(ctx, c, guest.RootShell, strings.NewReader(d.Install()), &out, &errOut)
	if err != nil {
		return fmt.Errorf("installing %s in VM %q: %w", guest.DevToolsMCPPackage, e.Record.Branch, err)
	}
	if code != 0 {
		return netpolicy.WithRefusals(ctx, vms, e, e.Slug, began, fmt.Errorf("installing %s in VM %q failed (exit status %d): %s (hint: the npm registry must be reachable: `agent-vm net show %s`)",
			guest.DevToolsMCPPackage, e.Record.Branch, code, termsafe.String(execx.TailLines(strings.TrimSpace(errOut.String()+out.String()), 5)), e.Slug))
	}
	servers := map[string]mcpconfig.Server{guest.DevToolsMCPName: mcpconfig.DevToolsServer(d)}
	if err := mcpsync.WriteGuestClaudeConfig(ctx, c, "~/"+guest.ClaudeConfig, servers, nil); err != nil {
		return err
	}
	notify(fmt.Sprintf("registered %s with the VM's Claude Code (~/%s, the workspace's MCP servers)", guest.DevToolsMCPName, guest.ClaudeConfig))
	return nil
}

// unregisterDevToolsMCP takes chrome-devtools-mcp out of the guest's
// Claude Code configuration (it stays installed).
func unregisterDevToolsMCP(ctx context.Context, vms VMs, e state.Entry) error {
	c, _, err := vms.Connect(ctx, e.Slug)
	if err != nil {
		return err
	}
	defer c.Close()
	return mcpsync.WriteGuestClaudeConfig(ctx, c, "~/"+guest.ClaudeConfig, nil, []string{guest.DevToolsMCPName})
}
