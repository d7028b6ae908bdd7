package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/mcpproxy"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// mcpConfigCommand prints the client entry for a VM's agent-mcp.
func mcpConfigCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "mcp-config",
		Usage:     "print the MCP client configuration for a VM's agent-mcp (contains its token)",
		ArgsUsage: "[BRANCH]",
		Description: "claude-code:    paste into .mcp.json (or claude mcp add-json NAME '<the entry>')\n" +
			"claude-desktop: merge into claude_desktop_config.json (runs mcp-remote through npx)\n" +
			"json:           name, URL and header for any other client",
		Flags:        []cli.Flag{&cli.StringFlag{Name: "client", Value: mcpproxy.ClientClaudeCode, Usage: "claude-code, claude-desktop or json"}},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			en, err := m.Find(cliCtx.Context, name)
			if err != nil {
				return err
			}
			if en.Record == nil {
				return en.Err
			}
			info := m.Status(cliCtx.Context, en, false)
			if info.Foreign != "" {
				return fmt.Errorf("VM %q runs the repository's own Vagrantfile %s, which runs no agent-mcp (hint: destroy it and create it with --vagrantfile=generate for agent-vm's own guest)", info.Branch, info.Foreign)
			}
			if info.MCP.Token == "" {
				return fmt.Errorf("VM %q has no MCP token in %s (hint: recreate the VM)", info.Branch, info.Paths.Dir)
			}
			client := cliCtx.String("client")
			switch client {
			case mcpproxy.ClientClaudeCode, mcpproxy.ClientClaudeDesktop, mcpproxy.ClientJSON:
			default:
				return cmdline.Usagef("--client %q: must be claude-code, claude-desktop or json", client)
			}
			out, err := mcpproxy.ClientConfig(client, info.SSH.Alias, info.MCP.URL, info.MCP.Token)
			if err != nil {
				return err
			}
			_, err = stdio.Out.Write(out)
			return err
		}),
	}
}
