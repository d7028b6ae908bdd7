package selfcmd

import (
	"net/netip"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/egress"
)

// testHooksTag is the build tag of a binary for the tests, whose egress
// proxy reads its test hooks (egress.TestHooks); `agent-vm version` says
// so after the version ("+testhooks"), which integration-test checks.
const testHooksTag = "agentvm_testhooks"

// netProxyCommand is the egress proxy the driver runs for each VM.
func netProxyCommand(stdio cmdline.IO) *cli.Command {
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
			o := egress.ServeOptions{Dir: cliCtx.String("dir"),
				ProxySocket: cliCtx.String("proxy-socket"), ExposedSocket: cliCtx.String("exposed-socket"),
				QEMUPidFile: cliCtx.String("qemu-pidfile"), RunAs: cliCtx.String("run-as"),
				Front: front, ExposedDir: cliCtx.String("exposed-dir"), Log: cmdline.ServiceLogger(cliCtx, stdio).Named("net-proxy")}
			for _, h := range []struct {
				name string
				to   *string
			}{{egress.TestHostsEnv, &o.TestHosts}, {egress.TestRootCAEnv, &o.TestRootCA}} {
				switch v := stdio.Getenv(h.name); {
				case v == "":
				case egress.TestHooks:
					*h.to = v
				default:
					o.Log.Warn("ignored: this agent-vm is built without the proxy's test hooks (go build -tags "+testHooksTag+")", "variable", h.name)
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
func netRelayCommand(stdio cmdline.IO) *cli.Command {
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
