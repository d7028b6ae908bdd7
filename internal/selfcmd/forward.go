package selfcmd

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/tcpfwd"
)

// netForwardCommand is a VM's host-side forwards when its guest has an
// address of its own (the libvirt driver starts it with the VM).
func netForwardCommand(stdio cmdline.IO) *cli.Command {
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
				for _, r := range rules {
					fmt.Fprintln(stdio.Out, tcpfwd.ListeningLine(r.Port))
				}
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
