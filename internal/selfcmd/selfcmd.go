// Package selfcmd holds the commands agent-vm runs of itself, not the verbs
// people type: on this machine beside a VM (its holder, its egress proxy,
// relay and forwards), on a libvirt host over agent-vm's link (a detached
// program, the libvirt driver's host verb, a workspace's check and
// settings, git's ssh), and in the guest (the MCP proxy, personalization
// of a guest restored from a template, the URL opener's client, the
// agents' hook, the npm installs of agent CLIs). They are hidden from --help; each parses its flags and
// calls one function of the package that owns the work. internal/cli adds them to its App, and they
// end as its verbs do (cmdline).
//
// A command that agent-vm's own processes run is named __NAME (__hold,
// __net-proxy); the net- ones keep their old names as aliases: a VM
// started by an older agent-vm has QEMU run net-relay, and its forwarder
// runs as net-forward. Four keep plain names because what calls them
// outlives a version of agent-vm: mcp-proxy (an MCP client's
// configuration, from mcp-config), open-url (the guest's xdg-open and
// $BROWSER shims), guest-personalize (run in a guest cloned from a
// template an older agent-vm may have built) and agent-state (an agent's
// hook, which the agent's session keeps for as long as it runs).
package selfcmd

import (
	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
)

// Commands are the hidden commands, for the App of agent-vm's binary.
func Commands(stdio cmdline.IO) []*cli.Command {
	return []*cli.Command{mcpProxyCommand(stdio), netProxyCommand(stdio), netRelayCommand(stdio), netForwardCommand(stdio),
		detachCommand(stdio), hostVerbCommand(stdio), hostExecCommand(stdio), workspaceCheckCommand(stdio), workspaceConfigCommand(stdio),
		holdCommand(stdio), personalizeCommand(stdio), openURLCommand(stdio), agentStateCommand(stdio), npmInstallCommand(stdio)}
}
