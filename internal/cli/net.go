package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

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
		return &cli.Command{
			Name: name, Usage: usage, ArgsUsage: "DOMAIN|'METHOD host/path'...", Description: netEditHelp,
			Flags: []cli.Flag{vmFlag()},
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
			"host, plus what net allow adds; open allows every destination; offline none. net deny\n" +
			"refuses a destination in every mode. Request rules ('METHOD host/path', see net allow --help)\n" +
			"judge the requests the proxy reads, those to a host a secret is bound to; with an upstream on\n" +
			"github.com the defaults let the agent read GitHub's API and open and comment on the upstream's pull\n" +
			"requests and issues, and refuse every other write. Changes apply at once, also to a running VM.",
		Subcommands: []*cli.Command{
			edit("allow", "allow DOMAINs (a name, *.suffix, or an IP address) or requests ('METHOD host/path')", func(c *cli.Context, m *vm.Manager, b string, d []string) (*netpolicy.Change, error) {
				return netpolicy.Allow(c.Context, m, b, d)
			}),
			edit("deny", "refuse DOMAINs in every mode, or requests ('METHOD host/path')", func(c *cli.Context, m *vm.Manager, b string, d []string) (*netpolicy.Change, error) {
				return netpolicy.Deny(c.Context, m, b, d)
			}),
			{
				Name: "mode", Usage: "set the egress mode: allow, open or offline", ArgsUsage: "MODE",
				Flags: []cli.Flag{vmFlag()},
				Action: func(cliCtx *cli.Context) error {
					if n := cliCtx.NArg(); n != 1 && !(n == 2 && !cliCtx.IsSet("vm")) {
						return cmdline.Usagef("net mode takes MODE (allow, open or offline), got %d arguments", n)
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						branch, args, err := vmAndArgs(cliCtx, stdio, m, twoWords)
						if err != nil {
							return err
						}
						ch, err := netpolicy.SetMode(cliCtx.Context, m, branch, args[0])
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
	for _, l := range pinLines(info.Pins) {
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
	verdict := "allowed"
	if !x.Allowed {
		verdict = "DENIED"
	}
	if x.Kind == egress.KindDevTools {
		// No connection: a DevTools call the DevTools relay refused, the
		// URL it would have loaded and the reason.
		line := fmt.Sprintf("%s  %-8s %-7s %s", x.Time.Local().Format(time.DateTime), x.Kind, verdict, termsafe.String(x.Request))
		if x.URL != "" {
			line += " " + termsafe.String(x.URL)
		}
		_, err := fmt.Fprintf(w, "%s  (%s)\n", line, termsafe.String(x.Rule))
		return err
	}
	if x.Kind == egress.KindOpenURL {
		// No connection: the URL the guest asked the host to open (of a
		// refused one, what was kept of it) and the verdict.
		url := x.URL
		if url == "" {
			url = "-"
		}
		_, err := fmt.Fprintf(w, "%s  %-7s %-7s %s  (%s)\n", x.Time.Local().Format(time.DateTime), x.Kind, verdict,
			termsafe.String(url), termsafe.String(x.Rule))
		return err
	}
	line := fmt.Sprintf("%s  %-7s %-7s %s:%d  (%s)  out %d B, in %d B", x.Time.Local().Format(time.DateTime), x.Kind, verdict,
		termsafe.String(x.Host), x.Port, termsafe.String(x.Rule), x.BytesOut, x.BytesIn)
	if x.Request != "" {
		line += "  " + termsafe.String(x.Request)
	}
	if len(x.Secrets) > 0 {
		line += "  secrets: " + termsafe.String(strings.Join(x.Secrets, ", "))
	}
	if len(x.Scrubbed) > 0 {
		line += "  scrubbed from the answer: " + termsafe.String(strings.Join(x.Scrubbed, ", "))
	}
	if x.Error != "" {
		line += "  error: " + termsafe.String(x.Error)
	}
	_, err := fmt.Fprintln(w, line)
	return err
}
