package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/mcpproxy"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// mcpProxyCommand is the MCP proxy the guests' agent-mcp unit runs.
func mcpProxyCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:   "mcp-proxy",
		Hidden: true, // what agent-mcp runs in the guest
		Usage:  "serve stdio MCP servers over HTTP (what agent-mcp runs inside every VM)",
		Description: "Serves each server of --config (Claude's mcpServers JSON, e.g. a project's .mcp.json) at\n" +
			"/servers/NAME/mcp (Streamable HTTP) and /servers/NAME/sse (HTTP+SSE); with one server also at\n" +
			"/mcp and /sse. Every MCP request needs the header Authorization: Bearer <token>; GET /health does not.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "MCP servers, Claude's mcpServers JSON (default: none)"},
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8000", Usage: "address to listen on"},
			// Required, but checked in Action: urfave's own check prints the
			// whole help and exits 1.
			&cli.StringFlag{Name: "token-file", Usage: "file holding the bearer token, mode 0600 or stricter (required)"},
			&cli.StringSliceFlag{Name: "allow-origin", Usage: "a browser origin allowed to call the proxy (repeatable)"},
			&cli.StringFlag{Name: "health-path", Value: "/health", Usage: "path of the unauthenticated health check"},
		},
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			if !cliCtx.IsSet("token-file") {
				return cmdline.Usagef("mcp-proxy needs --token-file (hint: --token-file FILE, a file holding the bearer token, mode 0600)")
			}
			e := newEnv(cliCtx, stdio)
			var cfg mcpproxy.Config
			if path := cliCtx.String("config"); path != "" {
				var err error
				if cfg, err = mcpproxy.LoadConfig(path); err != nil {
					return err
				}
			}
			token, err := mcpproxy.ReadToken(cliCtx.String("token-file"))
			if err != nil {
				return err
			}
			// Run returns nil after a graceful shutdown on SIGTERM, so
			// systemd sees a clean stop.
			return mcpproxy.Run(cliCtx.Context, mcpproxy.Options{
				Config: cfg, Token: token, Addr: cliCtx.String("listen"),
				AllowedOrigins: cliCtx.StringSlice("allow-origin"), HealthPath: cliCtx.String("health-path"),
				Logger: e.log.Named("mcp-proxy"),
			})
		},
	}
}

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
