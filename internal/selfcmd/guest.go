package selfcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/mcpproxy"
	"github.com/agent-vm/agent-vm/internal/npmunpack"
	"github.com/agent-vm/agent-vm/internal/personalize"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// mcpProxyCommand is the MCP proxy the guests' agent-mcp unit runs.
func mcpProxyCommand(stdio cmdline.IO) *cli.Command {
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
				Logger: cmdline.Logger(cliCtx, stdio).Named("mcp-proxy"),
			})
		},
	}
}

// personalizeCommand runs in a guest restored from a template, as root:
// it applies the plan on its standard input, which makes the guest one
// VM (internal/personalize; a start runs it over SSH).
func personalizeCommand(stdio cmdline.IO) *cli.Command {
	return &cli.Command{
		Name: personalize.Command, Hidden: true, Usage: "in a guest restored from a template: become one VM (agent-vm start runs it over SSH, as root)",
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			return personalize.ApplyHere(cliCtx.Context, stdio.In)
		},
	}
}

// openURLTimeout bounds a request to the host's URL-opening bridge: the host reads
// for at most bridge.ReadTimeout and waits briefly for its opener.
const openURLTimeout = 30 * time.Second

// openURLCommand runs in the guest, for xdg-open, sensible-browser,
// x-www-browser, www-browser and $BROWSER (the guest's shims run it with
// their arguments): it asks the host to open the URL through the VM's
// URL-opening bridge (internal/bridge).
func openURLCommand(stdio cmdline.IO) *cli.Command {
	return &cli.Command{
		Name: "open-url", Hidden: true, Usage: "in a guest: ask the host to open a URL (what xdg-open and $BROWSER run)", ArgsUsage: "URL",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Usage: "the URL-opening bridge's socket (default: the guest's, where the host serves it)"},
		},
		Action: func(cliCtx *cli.Context) error {
			if cliCtx.NArg() != 1 {
				return cmdline.Usagef("open-url takes one URL, got %d arguments (hint: agent-vm open-url https://...)", cliCtx.NArg())
			}
			ctx, cancel := context.WithTimeout(cliCtx.Context, openURLTimeout)
			defer cancel()
			a, err := bridge.AskOpen(ctx, cliCtx.String("socket"), cliCtx.Args().First())
			if errors.Is(err, bridge.ErrNoOpener) {
				return fmt.Errorf("opening URLs on the host is off for this VM; on the host, run: agent-vm browser %s --open-urls", thisVM())
			}
			if err != nil {
				return err
			}
			if a.Refused != "" {
				return errors.New(a.String())
			}
			_, err = fmt.Fprintf(stdio.Err, "agent-vm: %s\n", a)
			return err
		},
	}
}

// thisVM is the VM's name as the guest knows it: its host name, which is
// the VM's slug (the host resolves a slug as it does a branch); BRANCH when
// it cannot tell.
func thisVM() string {
	name, err := os.Hostname()
	if err != nil || name == "" {
		return "BRANCH"
	}
	return termsafe.String(name)
}

// agentStateCommand runs in the guest as the agents' hook (Claude Code's
// hooks, Codex's notify): it reads the hook's payload, Codex's last
// argument or else standard input, and keeps the state it reports as the
// agent's session's (internal/agentstate). It always exits 0, so that no
// hook of agent-vm's ever stops or blocks the agent: what goes wrong is
// said on standard error, which the agent may show.
func agentStateCommand(stdio cmdline.IO) *cli.Command {
	return &cli.Command{
		Name: agentstate.Command, Hidden: true, Usage: "in a guest: an agent's hook: keep the state it reports as its session's", ArgsUsage: "[PAYLOAD]",
		Action: func(cliCtx *cli.Context) error {
			var b []byte
			var err error
			if cliCtx.NArg() > 0 {
				b = []byte(cliCtx.Args().Get(cliCtx.NArg() - 1))
			} else if stdio.In != nil {
				b, err = io.ReadAll(io.LimitReader(stdio.In, agentstate.MaxPayload+1))
			}
			if err == nil {
				err = agentstate.Hook(cliCtx.Context, b, stdio.Getenv("TMUX_PANE"), time.Now())
			}
			if err != nil {
				fmt.Fprintf(stdio.Err, "agent-vm agent-state: %s\n", termsafe.String(err.Error()))
			}
			return nil
		},
	}
}

// npmInstallCommand runs in a guest, as root, where agent-vm installs npm
// packages (an agent CLI, the DevTools MCP server): it unpacks them
// itself where npm would do nothing else (minutes faster under TCG), else
// runs npm install --global with the same arguments, and ends with npm's
// status (internal/npmunpack).
func npmInstallCommand(stdio cmdline.IO) *cli.Command {
	return &cli.Command{
		Name: "__npm-install", Hidden: true, Usage: "in a guest: npm install --global, unpacking without npm what needs nothing else", ArgsUsage: "SPEC...",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "prefix", Usage: "npm's global prefix (default: npm's configuration's)"},
		},
		Action: func(cliCtx *cli.Context) error {
			specs := cliCtx.Args().Slice()
			if len(specs) == 0 {
				return cmdline.Usagef("__npm-install takes the packages to install, NAME@VERSION")
			}
			err := npmunpack.InstallHere(cliCtx.Context, cliCtx.String("prefix"), specs, stdio.Out, stdio.Err)
			if npm := (*npmunpack.NPMExit)(nil); errors.As(err, &npm) {
				return cmdline.ExitStatus(npm.Code)
			}
			return err
		},
	}
}
