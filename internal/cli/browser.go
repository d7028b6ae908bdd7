package cli

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/browser"
	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

const browserHelp = "Lets the agent in a running VM use the host's browser in up to three ways, each off until\n" +
	"asked for, for this VM only, and closed when the VM stops. --chrome-bridge tunnels Claude in Chrome:\n" +
	"the guest's Claude Code (run with --chrome) drives your Chrome through the Claude in Chrome\n" +
	"extension, with your logins (run claude --chrome on the host first). --cdp makes a host\n" +
	"Chrome/Chromium's DevTools endpoint (127.0.0.1:9222, or --port) reachable at the guest's\n" +
	"127.0.0.1:9222 through agent-vm's relay (web pages only: no file: or chrome: page, no download,\n" +
	"no host file handed to a page; refusals in net log) and registers chrome-devtools-mcp with the\n" +
	"guest's Claude Code; --launch starts agent-vm's own Chromium there first, with a profile of its\n" +
	"own that you log in to once, which opens no file: page and saves no download. --open-urls\n" +
	"lets xdg-open in the guest open http and https URLs on the host (logged in agent-vm net log).\n" +
	"A browser with your logins reaches whatever you can: the agent can act as you on every site you\n" +
	"are logged in to. A VM whose network is offline gets none of them without --force. Without a flag,\n" +
	"browser shows what is open; --off closes everything."

// browserCommand is `browser [BRANCH]`: what of the host's browser a
// running VM may use (the Claude in Chrome bridge, the DevTools relay,
// URL opening).
func browserCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: "browser", Usage: "let the agent in a VM use the host's browser (Claude in Chrome, DevTools, URLs)", ArgsUsage: "[BRANCH]",
		Description: browserHelp,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "chrome-bridge", Usage: "tunnel the host's Claude in Chrome bridge into the guest"},
			&cli.BoolFlag{Name: "cdp", Usage: "make the host browser's DevTools endpoint reachable in the guest, with chrome-devtools-mcp"},
			&cli.IntFlag{Name: "port", Usage: "the host DevTools endpoint's port on 127.0.0.1", Value: browser.DefaultDevToolsPort},
			&cli.BoolFlag{Name: "launch", Usage: "start agent-vm's own Chromium (its own profile) with DevTools on 127.0.0.1, then as --cdp"},
			&cli.BoolFlag{Name: "open-urls", Usage: "let the guest open http and https URLs on the host"},
			&cli.BoolFlag{Name: "off", Usage: "close every way of the VM to the host's browser: the bridge, the DevTools relay and URL opening"},
			&cli.BoolFlag{Name: "force", Usage: "open them even though the VM's network is offline"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			host := browser.Host{Run: m.Run, Dir: m.Dirs.Browser, Entries: m.Root.List}
			o := browser.Options{Name: name, ChromeBridge: cliCtx.Bool("chrome-bridge"), CDP: cliCtx.Bool("cdp"),
				Port: cliCtx.Int("port"), Launch: cliCtx.Bool("launch"), OpenURLs: cliCtx.Bool("open-urls"), Force: cliCtx.Bool("force"),
				Notify: func(s string) { fmt.Fprintf(stdio.Err, "agent-vm: %s\n", s) }, Getenv: stdio.Getenv, Launcher: host.Launch, Stop: host.Stop}
			opening := o.ChromeBridge || o.CDP || o.Launch || o.OpenURLs
			if cliCtx.IsSet("port") && !o.CDP && !o.Launch {
				return cmdline.Usagef("--port is the DevTools endpoint's: it goes with --cdp or --launch")
			}
			var info *browser.Info
			switch {
			case cliCtx.Bool("off") && (opening || o.Force):
				return cmdline.Usagef("--off closes them all: it goes with none of --chrome-bridge, --cdp, --launch, --open-urls and --force")
			case cliCtx.Bool("off"):
				info, err = browser.Off(cliCtx.Context, m, name, host.Stop, o.Notify)
			case opening:
				info, err = browser.Open(cliCtx.Context, m, o)
			case o.Force:
				return cmdline.Usagef("--force goes with what it opens (--chrome-bridge, --cdp, --launch, --open-urls)")
			default:
				info, err = browser.Show(cliCtx.Context, m, name)
			}
			if err != nil {
				return err
			}
			if cliCtx.Bool("json") {
				return writeJSON(stdio.Out, info)
			}
			printBrowserInfo(stdio.Out, info)
			return nil
		}),
	}
}

func printBrowserInfo(w io.Writer, info *browser.Info) {
	if len(info.Open) == 0 {
		fmt.Fprintf(w, "VM %s: the host's browser is closed to it (agent-vm browser %s --chrome-bridge | --cdp | --launch | --open-urls)\n", termsafe.String(info.Branch), info.VM)
		return
	}
	fmt.Fprintf(w, "VM %s: open to the host's browser:\n", termsafe.String(info.Branch))
	for _, l := range info.Open {
		fmt.Fprintf(w, "  %s\n", l)
	}
}
