package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/tcpfwd"
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
	if len(info.Requests) > 0 {
		fmt.Fprintln(w, "  request rules (the first that matches decides; for the hosts a secret is bound to):")
		for _, r := range info.Requests {
			verdict, pattern, _ := strings.Cut(r.Rule, " ")
			mark := ""
			if r.Default {
				mark = "  (default)"
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

// netProxyCommand is the egress proxy the driver runs for each VM.
func netProxyCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: "__net-proxy", Aliases: []string{"net-proxy"}, Hidden: true, Usage: "serve a VM's egress proxy (agent-vm starts it with the VM)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dir", Usage: "the VM's network directory (policy and log)"},
			&cli.StringFlag{Name: "proxy-socket", Usage: "the proxy's unix socket"},
			&cli.StringFlag{Name: "exposed-socket", Usage: "the unix socket the guest's connections to exposed host ports arrive on"},
			&cli.StringFlag{Name: "qemu-pidfile", Usage: "exit once the process of this pid file is gone"},
			&cli.StringFlag{Name: "run-as", Usage: "UID:GID to drop to before serving (agent-vm run as root)"},
			&cli.BoolFlag{Name: "secrets-stdin", Usage: "read the VM's CA and secrets from standard input (agent-vm writes them there)"},
			&cli.StringFlag{Name: "front", Usage: "also serve on TCP at this host address (a guest on a libvirt network of its own), on ports the kernel chooses"},
			&cli.IntSliceFlag{Name: "front-exposed", Usage: "an exposed host port served by the TCP front (repeatable)"},
			&cli.StringFlag{Name: "front-ports", Usage: "where the TCP front writes the ports it chose"},
			&cli.StringFlag{Name: "exposed-dir", Usage: "reach an exposed port at the unix socket DIR/PORT, not 127.0.0.1:PORT (a VM placed on another host)"},
		},
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			front, err := frontOf(cliCtx)
			if err != nil {
				return err
			}
			need := []string{"dir", "proxy-socket", "exposed-socket"}
			if front != nil {
				need = need[:1] // the front may serve alone
			}
			for _, f := range need {
				if cliCtx.String(f) == "" {
					return cmdline.Usagef("net-proxy needs --%s", f)
				}
			}
			e := newEnv(cliCtx, stdio)
			o := egress.ServeOptions{Dir: cliCtx.String("dir"),
				ProxySocket: cliCtx.String("proxy-socket"), ExposedSocket: cliCtx.String("exposed-socket"),
				QEMUPidFile: cliCtx.String("qemu-pidfile"), RunAs: cliCtx.String("run-as"),
				Front: front, ExposedDir: cliCtx.String("exposed-dir"), Log: e.log.Named("net-proxy")}
			for _, h := range []struct {
				name string
				to   *string
			}{{egress.TestHostsEnv, &o.TestHosts}, {egress.TestRootCAEnv, &o.TestRootCA}} {
				switch v := stdio.Getenv(h.name); {
				case v == "":
				case egress.TestHooks:
					*h.to = v
				default:
					o.Log.Warn("ignored: this agent-vm is built without the proxy's test hooks (go build -tags "+TestHooksTag+")", "variable", h.name)
				}
			}
			if cliCtx.Bool("secrets-stdin") {
				o.Secrets = stdio.In
			}
			return egress.Serve(cliCtx.Context, o)
		},
	}
}

// frontOf is net-proxy's TCP front, nil without --front.
func frontOf(cliCtx *cli.Context) (*egress.Front, error) {
	at := cliCtx.String("front")
	if at == "" {
		if cliCtx.IsSet("front-exposed") || cliCtx.IsSet("front-ports") {
			return nil, cmdline.Usagef("net-proxy: --front-exposed and --front-ports need --front")
		}
		return nil, nil
	}
	addr, err := netip.ParseAddr(at)
	if err != nil {
		return nil, cmdline.Usagef("net-proxy: --front %q is not an IP address", at)
	}
	if cliCtx.String("front-ports") == "" {
		return nil, cmdline.Usagef("net-proxy: --front needs --front-ports")
	}
	return &egress.Front{Addr: addr, Exposed: cliCtx.IntSlice("front-exposed"), PortsFile: cliCtx.String("front-ports")}, nil
}

// netRelayCommand carries one guest connection to the proxy: QEMU runs it
// per connection (guestfwd cmd) with the connection as stdin and stdout.
// Its stderr is the guest's connection too, so it prints nothing.
func netRelayCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: "__net-relay", Aliases: []string{"net-relay"}, Hidden: true, Usage: "carry one guest connection to the egress proxy (QEMU runs it)", ArgsUsage: "SOCKET [PORT]",
		Action: func(cliCtx *cli.Context) error {
			n := cliCtx.NArg()
			if n < 1 || n > 2 {
				return cmdline.ExitStatus(cmdline.ExitUsage)
			}
			exposed := 0 // the exposed host port the guest connects to; 0: the proxy
			if n == 2 {
				p, err := strconv.Atoi(cliCtx.Args().Get(1))
				if err != nil || p < 1 || p > 65535 {
					return cmdline.ExitStatus(cmdline.ExitUsage)
				}
				exposed = p
			}
			if err := egress.Relay(cliCtx.Context, cliCtx.Args().First(), exposed, stdio.In, stdio.Out); err != nil {
				return cmdline.ExitStatus(cmdline.ExitError)
			}
			return nil
		},
	}
}

// netForwardCommand is a VM's host-side forwards when its guest has an
// address of its own (the libvirt driver starts it with the VM).
func netForwardCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: "__net-forward", Aliases: []string{"net-forward"}, Hidden: true, Usage: "forward 127.0.0.1 ports to a VM's guest (agent-vm starts it with the VM)",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "forward", Usage: "PORT=HOST:PORT: 127.0.0.1:PORT carried to HOST:PORT (repeatable)"},
			&cli.StringFlag{Name: "pidfile", Usage: "exit once the process of this pid file (the VM's QEMU) is gone"},
			&cli.StringFlag{Name: "run-as", Usage: "UID:GID to drop to once listening (agent-vm run as root)"},
			&cli.StringFlag{Name: "tag", Usage: "what names the VM in the process table (agent-vm finds the process by it)"},
			&cli.StringFlag{Name: "via-addr", Usage: "HOST:PORT of a libvirt host's sshd: reach the destinations through agent-vm's SSH link to it (with the other --via flags)"},
			&cli.StringFlag{Name: "via-user", Usage: "the user the link to the host logs in as"},
			&cli.StringFlag{Name: "via-key", Usage: "agent-vm's private key for the host, read before --run-as drops privileges"},
			&cli.StringFlag{Name: "via-known-hosts", Usage: "the file pinning the host's key, read before --run-as drops privileges"},
			&cli.StringSliceFlag{Name: "return-socket", Usage: "SOCKET=PORT: the unix socket SOCKET made on the host (through the link), its connections carried back to 127.0.0.1:PORT here (repeatable; needs the --via flags)"},
			&cli.StringFlag{Name: "return-socket-owner", Usage: "UID:GID on the host to give the --return-socket sockets to (the egress proxy's user there)"},
		},
		Action: func(cliCtx *cli.Context) error {
			if err := cmdline.NoArgs(cliCtx); err != nil {
				return err
			}
			var rules []tcpfwd.Rule
			for _, s := range cliCtx.StringSlice("forward") {
				r, err := tcpfwd.ParseRule(s)
				if err != nil {
					return cmdline.Usagef("net-forward: %v", err)
				}
				rules = append(rules, r)
			}
			returns, err := returnSocketsOf(cliCtx.StringSlice("return-socket"))
			if err != nil {
				return err
			}
			if len(rules) == 0 && len(returns) == 0 {
				return cmdline.Usagef("net-forward needs at least one --forward PORT=HOST:PORT or --return-socket SOCKET=PORT")
			}
			uid, gid := -1, -1
			if ra := cliCtx.String("run-as"); ra != "" {
				if _, err := fmt.Sscanf(ra, "%d:%d", &uid, &gid); err != nil || uid <= 0 || gid < 0 {
					return cmdline.Usagef("net-forward: --run-as %q is not UID:GID of a user other than root", ra)
				}
			}
			via, err := viaOf(cliCtx)
			if err != nil {
				return err
			}
			if len(returns) > 0 && via == nil {
				return cmdline.Usagef("net-forward: --return-socket needs the --via flags (the host the socket is made on)")
			}
			var dial tcpfwd.Dialer // nil: from this host
			var tun *hostlink.Tunnel
			if via != nil {
				// The key and the pin are read now, while root may.
				if tun, err = hostlink.NewTunnel(*via); err != nil {
					return err
				}
				defer tun.Close()
				dial = tun.Dial
			}
			var f *tcpfwd.Forwarder
			if len(rules) > 0 {
				if f, err = tcpfwd.Listen(rules); err != nil {
					return err
				}
				defer f.Close()
			}
			ctx := cliCtx.Context
			if pf := cliCtx.String("pidfile"); pf != "" {
				pid, err := egress.WaitPid(ctx, pf, 2*time.Minute)
				if err != nil {
					return err
				}
				ctx = egress.Orphaned(ctx, pid)
			}
			if uid > 0 {
				if err := egress.DropPrivileges(uid, gid); err != nil {
					return err
				}
			}
			return serveForwards(ctx, f, dial, tun, returns, cliCtx.String("return-socket-owner"), stdio.Out)
		},
	}
}

// returnSocket is a --return-socket of net-forward: a unix socket made on
// the host whose connections are carried back to a port of this machine's
// 127.0.0.1.
type returnSocket struct {
	socket string
	port   int
}

func returnSocketsOf(specs []string) ([]returnSocket, error) {
	var out []returnSocket
	for _, s := range specs {
		sock, p, ok := strings.Cut(s, "=")
		port, err := strconv.Atoi(p)
		if !ok || !strings.HasPrefix(sock, "/") || err != nil || port < 1 || port > 65535 {
			return nil, cmdline.Usagef("net-forward: --return-socket %q is not SOCKET=PORT (an absolute path on the host, a port here)", s)
		}
		out = append(out, returnSocket{socket: sock, port: port})
	}
	return out, nil
}

// serveForwards serves f's forwards (if any) and the return sockets until
// ctx ends or one of them fails. Each return socket made prints
// hostlink.SocketReadyLine on out: the driver waits for those lines before
// the VM's start goes on.
func serveForwards(ctx context.Context, f *tcpfwd.Forwarder, dial tcpfwd.Dialer, tun *hostlink.Tunnel, returns []returnSocket, owner string, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(returns)+1)
	if f != nil {
		go func() { errs <- f.Serve(ctx, dial) }()
	}
	for _, d := range returns {
		to := net.JoinHostPort("127.0.0.1", strconv.Itoa(d.port))
		go func() {
			errs <- tun.ServeSocket(ctx, d.socket, owner, func(ctx context.Context) (net.Conn, error) {
				var nd net.Dialer
				return nd.DialContext(ctx, "tcp", to)
			}, func() { fmt.Fprintln(out, hostlink.SocketReadyLine(d.socket)) })
		}()
	}
	return <-errs
}

// viaOf is net-forward's link to the host its destinations are reached
// from, nil without the --via flags; they come all four or none.
func viaOf(cliCtx *cli.Context) (*hostlink.Target, error) {
	var set, missing []string
	for _, name := range []string{"via-addr", "via-user", "via-key", "via-known-hosts"} {
		if cliCtx.String(name) != "" {
			set = append(set, "--"+name)
		} else {
			missing = append(missing, "--"+name)
		}
	}
	if len(set) == 0 {
		return nil, nil
	}
	if len(missing) > 0 {
		return nil, cmdline.Usagef("net-forward: %s needs %s too (the link to a host is all four --via flags, or none)", strings.Join(set, ", "), strings.Join(missing, ", "))
	}
	addr := cliCtx.String("via-addr")
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return nil, cmdline.Usagef("net-forward: --via-addr %q is not HOST:PORT (the host's sshd)", addr)
	}
	return &hostlink.Target{Addr: addr, User: cliCtx.String("via-user"),
		KeyFile: cliCtx.String("via-key"), KnownHosts: cliCtx.String("via-known-hosts")}, nil
}
