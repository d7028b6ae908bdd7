package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

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
			Name: name, Usage: usage, ArgsUsage: "BRANCH DOMAIN...",
			Action: func(cliCtx *cli.Context) error {
				if cliCtx.NArg() < 2 {
					return usagef("net %s takes BRANCH DOMAIN... (e.g. example.com, *.example.com, 203.0.113.7), got %d arguments", name, cliCtx.NArg())
				}
				return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					args := cliCtx.Args().Slice()
					ch, err := apply(cliCtx, m, args[0], args[1:])
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
			"ports exposed to it (`agent-vm port expose`). Mode allow (the default) allows the allow-list: agent\n" +
			"APIs, package registries, Debian's mirrors, common git hosts and the repository's git remote\n" +
			"host, plus what `net allow` adds; open allows every destination; offline none. `net deny`\n" +
			"refuses a destination in every mode. Changes apply at once, also to a running VM.",
		Subcommands: []*cli.Command{
			edit("allow", "allow DOMAINs (a name, *.suffix, or an IP address)", func(c *cli.Context, m *vm.Manager, b string, d []string) (*netpolicy.Change, error) {
				return netpolicy.Allow(c.Context, m, b, d)
			}),
			edit("deny", "refuse DOMAINs in every mode", func(c *cli.Context, m *vm.Manager, b string, d []string) (*netpolicy.Change, error) {
				return netpolicy.Deny(c.Context, m, b, d)
			}),
			{
				Name: "mode", Usage: "set the egress mode: allow, open or offline", ArgsUsage: "BRANCH MODE",
				Action: func(cliCtx *cli.Context) error {
					if cliCtx.NArg() != 2 {
						return usagef("net mode takes BRANCH MODE (allow, open or offline), got %d arguments", cliCtx.NArg())
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						ch, err := netpolicy.SetMode(cliCtx.Context, m, cliCtx.Args().Get(0), cliCtx.Args().Get(1))
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
					entries, path, err := netpolicy.Log(cliCtx.Context, m, name)
					if err != nil {
						return err
					}
					print := func(x egress.Entry) error { return printNetEntry(stdio.Out, x, cliCtx.Bool("json")) }
					for _, x := range entries {
						if err := print(x); err != nil {
							return err
						}
					}
					if cliCtx.Bool("follow") {
						return netpolicy.Follow(cliCtx.Context, path, print)
					}
					return nil
				}),
			},
		},
	}
}

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
		return
	}
	fmt.Fprintf(w, "VM %s: egress mode %s, through the proxy at %s\n", termsafe.String(info.Branch), info.Mode, info.Proxy)
	fmt.Fprintf(w, "  allow:   %s\n", strings.Join(info.Allow, " "))
	if len(info.Deny) > 0 {
		fmt.Fprintf(w, "  deny:    %s\n", strings.Join(info.Deny, " "))
	}
	var doors []string
	for _, x := range info.Exposed {
		doors = append(doors, fmt.Sprintf("%d (%s)", x.Port, termsafe.String(x.By)))
	}
	if len(doors) == 0 {
		doors = []string{"none"}
	}
	fmt.Fprintf(w, "  exposed host ports: %s\n", strings.Join(doors, ", "))
	fmt.Fprintf(w, "  log:     %s\n", info.Log)
}

func printNetEntry(w io.Writer, x egress.Entry, asJSON bool) error {
	if asJSON {
		return writeJSON(w, x)
	}
	verdict := "allowed"
	if !x.Allowed {
		verdict = "DENIED"
	}
	line := fmt.Sprintf("%s  %-7s %-7s %s:%d  (%s)  out %d B, in %d B", x.Time.Local().Format(time.DateTime), x.Kind, verdict,
		termsafe.String(x.Host), x.Port, termsafe.String(x.Rule), x.BytesOut, x.BytesIn)
	if x.Request != "" {
		line += "  " + termsafe.String(x.Request)
	}
	if len(x.Secrets) > 0 {
		line += "  secrets: " + termsafe.String(strings.Join(x.Secrets, ", "))
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
		Name: "net-proxy", Hidden: true, Usage: "serve a VM's egress proxy (agent-vm starts it with the VM)", ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dir", Usage: "the VM's network directory (policy and log)"},
			&cli.StringFlag{Name: "proxy-socket", Usage: "the proxy's unix socket"},
			&cli.StringFlag{Name: "door-socket", Usage: "the exposed ports' unix socket"},
			&cli.StringFlag{Name: "qemu-pidfile", Usage: "exit once the process of this pid file is gone"},
			&cli.StringFlag{Name: "run-as", Usage: "UID:GID to drop to before serving (agent-vm run as root)"},
			&cli.BoolFlag{Name: "secrets-stdin", Usage: "read the VM's CA and secrets from standard input (agent-vm writes them there)"},
		},
		Action: func(cliCtx *cli.Context) error {
			if err := noArgs(cliCtx); err != nil {
				return err
			}
			for _, f := range []string{"dir", "proxy-socket", "door-socket"} {
				if cliCtx.String(f) == "" {
					return usagef("net-proxy needs --%s", f)
				}
			}
			e := newEnv(cliCtx, stdio)
			o := egress.ServeOptions{Dir: cliCtx.String("dir"),
				ProxySocket: cliCtx.String("proxy-socket"), DoorSocket: cliCtx.String("door-socket"),
				QEMUPidFile: cliCtx.String("qemu-pidfile"), RunAs: cliCtx.String("run-as"),
				TestHosts: stdio.Getenv(egress.TestHostsEnv), TestRootCA: stdio.Getenv(egress.TestRootCAEnv),
				Log: e.log.Named("net-proxy")}
			if cliCtx.Bool("secrets-stdin") {
				o.Secrets = stdio.In
			}
			return egress.Serve(cliCtx.Context, o)
		},
	}
}

// netRelayCommand carries one guest connection to the proxy: QEMU runs it
// per connection (guestfwd cmd) with the connection as stdin and stdout.
// Its stderr is the guest's connection too, so it prints nothing.
func netRelayCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: "net-relay", Hidden: true, Usage: "carry one guest connection to the egress proxy (QEMU runs it)", ArgsUsage: "SOCKET [PORT]",
		Action: func(cliCtx *cli.Context) error {
			n := cliCtx.NArg()
			if n < 1 || n > 2 {
				return &exitCodeError{code: ExitUsage}
			}
			door := 0
			if n == 2 {
				p, err := strconv.Atoi(cliCtx.Args().Get(1))
				if err != nil || p < 1 || p > 65535 {
					return &exitCodeError{code: ExitUsage}
				}
				door = p
			}
			if err := egress.Relay(cliCtx.Context, cliCtx.Args().First(), door, stdio.In, stdio.Out); err != nil {
				return &exitCodeError{code: ExitError}
			}
			return nil
		},
	}
}
