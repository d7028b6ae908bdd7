package cli

import (
	"os"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/top"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// topCommand is `top [--once|--json] [--every D]`: every VM on one screen.
func topCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "top",
		Usage: "one screen for every VM: what its agents are doing, CPU, memory (PSS), network, pending asks; keys act on the selected VM",
		Description: "Keys: enter attach, l logs, s suspend, r resume, y/n approve or deny the oldest ask, d destroy\n" +
			"(asks first), / filter by repository or branch, q quit. The bell rings when an agent starts\n" +
			"waiting. It needs a terminal of at least 60x10; --once prints one screen for any output.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "once", Usage: "print one screen as text and exit (what top shows, for a pipe or a log)"},
			&cli.BoolFlag{Name: "json", Usage: `print one snapshot as JSON and exit: {"taken", "vms": [{"vm", "branch", "repo", "state", "sessions", "agent_state", "last_line", "cpu_percent", "pss_bytes", "connections_1m", "refused_1m", "asks"}]}`},
			&cli.DurationFlag{Name: "every", Value: 2 * time.Second, Usage: "how often the screen reads the VMs again"},
		},
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			g := &top.Gatherer{VMs: m}
			switch {
			case cliCtx.Bool("json"):
				return top.Print(cliCtx.Context, g, stdio.Out, writeJSON)
			case cliCtx.Bool("once") || stdio.In == nil || !term.IsTerminal(int(stdio.In.Fd())):
				return top.Print(cliCtx.Context, g, stdio.Out, nil)
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			out, _ := stdio.Out.(*os.File)
			return top.Run(cliCtx.Context, top.Options{Gatherer: g, Self: self, StateDir: e.stateDir, Every: cliCtx.Duration("every"),
				NoColor: cliCtx.Bool("no-color") || stdio.Getenv("NO_COLOR") != "", In: stdio.In, Out: out})
		}),
	}
}
