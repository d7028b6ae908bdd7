package cli

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// askCommand is `net approve [--vm BRANCH] ID... [--always]`: a pending
// ask's connection let through (net deny ID refuses it).
func askCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: "approve", Usage: "let connections held by mode ask through: ID... (see net pending)", ArgsUsage: "ID...",
		Flags: []cli.Flag{vmFlag(), alwaysFlag("and allow their names from now on, as net allow does")},
		Action: func(cliCtx *cli.Context) error {
			if cliCtx.NArg() < 1 {
				return cmdline.Usagef("net approve takes ID... (the asks agent-vm net pending lists), got none")
			}
			return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
				old := func(args []string) bool { _, ok := askIDs(args[:1]); return len(args) > 1 && !ok }
				branch, args, err := vmAndArgs(cliCtx, stdio, m, old)
				if err != nil {
					return err
				}
				ids, ok := askIDs(args)
				if !ok {
					return cmdline.Usagef("net approve takes ask IDs, numbers as agent-vm net pending lists them, got %q", args)
				}
				return answerAsks(cliCtx, stdio, m, branch, ids, true)
			})(cliCtx)
		},
	}
}

// alwaysFlag is net approve's and net deny's --always.
func alwaysFlag(usage string) cli.Flag { return &cli.BoolFlag{Name: "always", Usage: usage} }

// askIDs reads args as ask IDs: each a number (which no DOMAIN is).
func askIDs(args []string) ([]int, bool) {
	ids := make([]int, 0, len(args))
	for _, a := range args {
		id, err := strconv.Atoi(a)
		if err != nil || id < 1 {
			return nil, false
		}
		ids = append(ids, id)
	}
	return ids, len(ids) > 0
}

// answerAsks is net approve, and net deny with ask IDs.
func answerAsks(cliCtx *cli.Context, stdio IO, m *vm.Manager, branch string, ids []int, allow bool) error {
	res, err := netpolicy.Answer(cliCtx.Context, m, branch, ids, allow, cliCtx.Bool("always"))
	if err != nil {
		return err
	}
	verb := "refused"
	if allow {
		verb = "let through"
	}
	for _, a := range res.Asks {
		fmt.Fprintf(stdio.Out, "%s: ask %d, %s\n", verb, a.ID, askLine(a))
	}
	if res.Change != nil {
		return printNetChange(stdio.Out, res.Change)
	}
	return nil
}

// pendingCommand is `net pending [BRANCH] [--json]`.
func pendingCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: "pending", Usage: "list the connections mode ask holds for your answer", ArgsUsage: "[BRANCH]",
		Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: `print JSON: {"branch", "mode", "asks": [{"id", "time", "until", "kind", "host", "port", "method", "path"}]}`}},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			p, err := netpolicy.Asks(cliCtx.Context, m, name)
			if err != nil || cliCtx.Bool("json") {
				if err == nil {
					err = writeJSON(stdio.Out, p)
				}
				return err
			}
			printPending(stdio.Out, p, time.Now())
			return nil
		}),
	}
}

func printPending(w io.Writer, p *netpolicy.Pending, now time.Time) {
	b := termsafe.String(p.Branch)
	if len(p.Asks) == 0 {
		hint := ""
		if p.Mode != egress.ModeAsk {
			hint = fmt.Sprintf(" (its mode is %s: agent-vm net mode --vm %s ask holds unlisted names for your answer)", p.Mode, b)
		}
		fmt.Fprintf(w, "VM %s: no connection waits for an answer%s\n", b, hint)
		return
	}
	rows := [][]string{{"ID", "WAITING", "LEFT", "REQUEST"}}
	for _, a := range p.Asks {
		rows = append(rows, []string{strconv.Itoa(a.ID), now.Sub(a.Time).Round(time.Second).String(),
			max(a.Until.Sub(now), 0).Round(time.Second).String(), askLine(a)})
	}
	_ = writeTable(w, rows)
	fmt.Fprintf(w, "agent-vm net approve --vm %s ID [--always] lets one through (--always: its name from now on); net deny ... ID refuses it\n", b)
}

// askLine is an ask's request: host:port and method, with a plain HTTP
// request's path.
func askLine(a egress.Ask) string {
	s := fmt.Sprintf("%s:%d %s", a.Host, a.Port, a.Method)
	if a.Path != "" {
		s += " " + a.Path
	}
	return termsafe.String(s)
}
