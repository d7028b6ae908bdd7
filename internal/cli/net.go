package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// netCommand is `net allow|deny|mode|show|log`: a VM's egress policy and
// its connection log.
func netCommand(stdio IO) *cli.Command {
	edit := func(name, usage string, apply func(*cli.Context, *vm.Manager, string, []string) (*netpolicy.Change, error)) *cli.Command {
		flags := []cli.Flag{vmFlag()}
		if name == "deny" {
			flags = append(flags, alwaysFlag("and refuse their names from now on, as net deny DOMAIN does"))
		}
		return &cli.Command{
			Name: name, Usage: usage, ArgsUsage: "DOMAIN|'METHOD host/path'...", Description: netEditHelp,
			Flags: flags,
			Action: func(cliCtx *cli.Context) error {
				if cliCtx.NArg() < 1 {
					return cmdline.Usagef("net %s takes DOMAIN... (e.g. example.com, *.example.com, 203.0.113.7, or a request rule such as 'POST api.github.com/repos/o/r/pulls'), got none", name)
				}
				return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					// The old spelling led with BRANCH: a first word that
					// names a VM, before at least one DOMAIN.
					old := func(args []string) bool {
						if len(args) < 2 {
							return false
						}
						_, err := m.Find(cliCtx.Context, args[0])
						return err == nil
					}
					branch, args, err := vmAndArgs(cliCtx, stdio, m, old)
					if err != nil {
						return err
					}
					if ids, ok := askIDs(args); ok && name == "deny" {
						return answerAsks(cliCtx, stdio, m, branch, ids, false)
					}
					if cliCtx.Bool("always") {
						return cmdline.Usagef("net deny --always is for ask IDs (see net pending); net deny DOMAIN refuses it from now on already")
					}
					ch, err := apply(cliCtx, m, branch, args)
					if err != nil {
						return err
					}
					return printNetChange(stdio.Out, ch)
				})(cliCtx)
			},
		}
	}
	return &cli.Command{
		Name:  "net",
		Usage: "a VM's network: what it may reach (through agent-vm's proxy) and what it connected to",
		Description: "A VM reaches the network only through its egress proxy, and the host only through the\n" +
			"ports exposed to it (agent-vm port expose). Mode allow (the default) allows the allow-list: agent\n" +
			"APIs, package registries, Debian's mirrors, common git hosts and the repository's git remote\n" +
			"host, plus what net allow adds; ask allows the same and holds a connection to any other name\n" +
			"while you are asked (net pending, net approve, net deny ID); open allows every destination;\n" +
			"offline none. net deny refuses a destination in every mode. Request rules ('METHOD host/path',\n" +
			"see net allow --help) judge the requests the proxy reads, those to a host a secret is bound to;\n" +
			"with an upstream on github.com the defaults let the agent read GitHub's API and open and comment\n" +
			"on the upstream's pull requests and issues, and refuse every other write. Changes apply at once,\n" +
			"also to a running VM.",
		Subcommands: []*cli.Command{
			edit("allow", "allow DOMAINs (a name, *.suffix, or an IP address) or requests ('METHOD host/path')", func(c *cli.Context, m *vm.Manager, b string, d []string) (*netpolicy.Change, error) {
				return netpolicy.Allow(c.Context, m, b, d)
			}),
			edit("deny", "refuse DOMAINs in every mode, or requests ('METHOD host/path'); or refuse pending asks: ID... (see net pending)", func(c *cli.Context, m *vm.Manager, b string, d []string) (*netpolicy.Change, error) {
				return netpolicy.Deny(c.Context, m, b, d)
			}),
			askCommand(stdio),
			pendingCommand(stdio),
			{
				Name: "mode", Usage: "set the egress mode: allow, ask, open or offline", ArgsUsage: "MODE",
				Flags: []cli.Flag{vmFlag(), &cli.DurationFlag{Name: "wait", Usage: "with ask: how long a connection waits for your answer before it is refused", DefaultText: "60s"}},
				Action: func(cliCtx *cli.Context) error {
					if n := cliCtx.NArg(); n != 1 && !(n == 2 && !cliCtx.IsSet("vm")) {
						return cmdline.Usagef("net mode takes MODE (allow, ask, open or offline), got %d arguments", n)
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						branch, args, err := vmAndArgs(cliCtx, stdio, m, twoWords)
						if err != nil {
							return err
						}
						ch, err := netpolicy.SetMode(cliCtx.Context, m, branch, args[0], cliCtx.Duration("wait"))
						if err != nil {
							return err
						}
						return printNetChange(stdio.Out, ch)
					})(cliCtx)
				},
			},
			{
				Name: "show", Usage: "print the VM's egress mode, allow-list, refusals and exposed host ports", ArgsUsage: "[BRANCH]",
				Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
				BashComplete: vmCompletion(stdio),
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					name, err := vmName(cliCtx, m)
					if err != nil {
						return err
					}
					info, err := netpolicy.Show(cliCtx.Context, m, name)
					if err != nil {
						return err
					}
					if cliCtx.Bool("json") {
						return writeJSON(stdio.Out, info)
					}
					printNetInfo(stdio.Out, info)
					return nil
				}),
			},
			{
				Name: "log", Usage: "print the VM's connections: time, destination, allowed or denied and by which rule, bytes each way", ArgsUsage: "[BRANCH]",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "json", Usage: "print JSON lines"},
					&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new connections"},
				},
				BashComplete: vmCompletion(stdio),
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					name, err := vmName(cliCtx, m)
					if err != nil {
						return err
					}
					entries, _, err := netpolicy.Log(cliCtx.Context, m, name)
					if err != nil {
						return err
					}
					print := func(x egress.LogEntry) error { return printNetEntry(stdio.Out, x, cliCtx.Bool("json")) }
					for _, x := range entries {
						if err := print(x); err != nil {
							return err
						}
					}
					if cliCtx.Bool("follow") {
						return netpolicy.Follow(cliCtx.Context, m, name, print)
					}
					return nil
				}),
			},
		},
	}
}

// netEditHelp is the help of net allow and net deny.
const netEditHelp = `A DOMAIN is a host name, *.suffix (its subdomains, not itself) or an IP address: net allow lets
the VM connect to it, net deny refuses it in every mode.

A request rule, 'METHOD host/path' (quoted: one argument with a space in it), judges the HTTPS requests
the proxy reads, those to a host a secret is bound to; other connections stay opaque tunnels. METHOD
is GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS or * (any); host is a name, matched exactly; in the
path, * matches one segment and a final ** the rest (none or more); a request's query is not matched.
An allow rule for a POST of GraphQL may end with graphql:FIELD,... : it then matches queries, and
mutations whose top-level fields are all listed.

The rules are tried in order and the first that matches decides; a request none matches is allowed.
The rules added here come first, the newest first (one of the same pattern is replaced), then
agent-vm's defaults; agent-vm net show BRANCH lists them in that order. With an upstream on
github.com, the defaults let the agent read GitHub's API and open and comment on the upstream's pull
requests and issues (GraphQL: createPullRequest, addComment), and refuse every other write.

Examples:
   agent-vm net allow --vm feat-x pypi.example.org
   agent-vm net allow --vm feat-x 'PUT api.github.com/repos/o/r/pulls/*/merge'
   agent-vm net allow --vm feat-x 'POST api.github.com/graphql graphql:mergePullRequest'
   agent-vm net deny --vm feat-x 'POST api.github.com/repos/o/r/issues'`

func printNetChange(w io.Writer, ch *netpolicy.Change) error {
	printNetInfo(w, ch.Info)
	if ch.Live {
		fmt.Fprintln(w, "(the VM runs: its proxy applies this at once)")
	}
	return nil
}

func printNetInfo(w io.Writer, info *netpolicy.Info) {
	if info.Uncontained != "" {
		fmt.Fprintf(w, "VM %s: network %s\n", termsafe.String(info.Branch), termsafe.String(info.Uncontained))
		printBrowserLines(w, info.Browser)
		return
	}
	fmt.Fprintf(w, "VM %s: egress mode %s, through the proxy at %s\n", termsafe.String(info.Branch), info.Mode, info.Proxy)
	if info.Mode == egress.ModeAsk {
		fmt.Fprintf(w, "  ask:     a name off the allow-list waits up to %d s for your answer; %d waiting now (agent-vm net pending %s)\n", info.AskWait, info.Pending, termsafe.String(info.Branch))
	}
	fmt.Fprintf(w, "  allow:   %s\n", strings.Join(info.Allow, " "))
	if len(info.Deny) > 0 {
		fmt.Fprintf(w, "  deny:    %s\n", strings.Join(info.Deny, " "))
	}
	if rp := info.Repository; rp != nil {
		fmt.Fprintf(w, "  from the repository's %s, as the VM was made:", termsafe.String(rp.File))
		if len(rp.Allow) > 0 {
			fmt.Fprintf(w, " allow %s;", strings.Join(rp.Allow, " "))
		}
		if len(rp.Deny) > 0 {
			fmt.Fprintf(w, " deny %s;", strings.Join(rp.Deny, " "))
		}
		fmt.Fprintf(w, " %d request rules\n", len(rp.Requests))
	}
	for _, l := range info.Narrowed {
		fmt.Fprintf(w, "  narrowed by the repository: %s\n", termsafe.String(l))
	}
	if len(info.Added) > 0 {
		fmt.Fprintf(w, "  added with net allow: %s\n", strings.Join(info.Added, " "))
	}
	if len(info.Requests) > 0 {
		fmt.Fprintln(w, "  request rules (the first that matches decides; for the hosts a secret is bound to):")
		for _, r := range info.Requests {
			verdict, pattern, _ := strings.Cut(r.Rule, " ")
			mark := ""
			switch {
			case r.Default:
				mark = "  (default)"
			case r.Repository:
				mark = "  (repository)"
			}
			fmt.Fprintf(w, "    %-5s %s%s\n", verdict, termsafe.String(pattern), mark)
		}
	}
	var exposed []string
	for _, x := range info.Exposed {
		exposed = append(exposed, fmt.Sprintf("%d (%s)", x.Port, termsafe.String(x.By)))
	}
	if len(exposed) == 0 {
		exposed = []string{"none"}
	}
	fmt.Fprintf(w, "  exposed host ports: %s\n", strings.Join(exposed, ", "))
	for _, l := range egress.PinLines(info.Pins) {
		fmt.Fprintf(w, "  pinned:  %s (the host's pins, every VM's: `agent-vm setup`)\n", l)
	}
	printBrowserLines(w, info.Browser)
	fmt.Fprintf(w, "  log:     %s\n", info.Log)
}

// printBrowserLines says what of the host's browser the VM may use
// (agent-vm browser).
func printBrowserLines(w io.Writer, lines []string) {
	if len(lines) == 0 {
		fmt.Fprintln(w, "  browser: none (agent-vm browser lets the VM use the host's browser)")
		return
	}
	for _, l := range lines {
		fmt.Fprintf(w, "  browser: %s\n", l)
	}
}

func printNetEntry(w io.Writer, x egress.LogEntry, asJSON bool) error {
	if asJSON {
		return writeJSON(w, x)
	}
	_, err := fmt.Fprintln(w, x.Line())
	return err
}
