package cli

import (
	"fmt"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
)

// portCommand is `port add|rm|list`: the VM's own port forwards.
func portCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "port",
		Usage: "forward a guest port (a dev server) to 127.0.0.1 on the host",
		Description: "A forward is live while the VM runs and kept in its record, so every start applies it.\n" +
			"The server in the guest must listen on 0.0.0.0 (or the guest's address), not 127.0.0.1.",
		Subcommands: []*cli.Command{
			{
				Name:      "add",
				Usage:     "forward GUEST_PORT to 127.0.0.1:HOST_PORT (default: the same number if free, else a free port)",
				ArgsUsage: "BRANCH GUEST_PORT [HOST_PORT]",
				Action: func(cliCtx *cli.Context) error {
					if n := cliCtx.NArg(); n < 2 || n > 3 {
						return usagef("port add takes BRANCH GUEST_PORT [HOST_PORT], got %d arguments", n)
					}
					guest, err := portArg(cliCtx, 1, "GUEST_PORT")
					if err != nil {
						return err
					}
					host := 0
					if cliCtx.NArg() == 3 {
						if host, err = portArg(cliCtx, 2, "HOST_PORT"); err != nil {
							return err
						}
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						ch, err := m.PortAdd(cliCtx.Context, cliCtx.Args().First(), guest, host)
						if err != nil {
							return err
						}
						f := ch.Forward
						switch {
						case ch.Unchanged:
							fmt.Fprintf(stdio.Out, "guest port %d of %s is already forwarded to 127.0.0.1:%d; nothing changed\n", f.Guest, ch.Slug, f.Host)
						case ch.Live:
							fmt.Fprintf(stdio.Out, "guest port %d of %s is forwarded to 127.0.0.1:%d\n", f.Guest, ch.Slug, f.Host)
						default:
							fmt.Fprintf(stdio.Out, "guest port %d of %s will be forwarded to 127.0.0.1:%d: the VM is not running, so the forward applies at its next start (`agent-vm start %s`)\n", f.Guest, ch.Slug, f.Host, ch.Slug)
						}
						return nil
					})(cliCtx)
				},
			},
			{
				Name:      "rm",
				Usage:     "end the forward of GUEST_PORT",
				ArgsUsage: "BRANCH GUEST_PORT",
				Action: func(cliCtx *cli.Context) error {
					if n := cliCtx.NArg(); n != 2 {
						return usagef("port rm takes BRANCH GUEST_PORT, got %d arguments", n)
					}
					guest, err := portArg(cliCtx, 1, "GUEST_PORT")
					if err != nil {
						return err
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						ch, err := m.PortRemove(cliCtx.Context, cliCtx.Args().First(), guest)
						if err != nil {
							return err
						}
						fmt.Fprintf(stdio.Out, "guest port %d of %s is no longer forwarded (it was on 127.0.0.1:%d)\n", ch.Forward.Guest, ch.Slug, ch.Forward.Host)
						return nil
					})(cliCtx)
				},
			},
			{
				Name:         "list",
				Aliases:      []string{"ls"},
				Usage:        "list a VM's port forwards",
				ArgsUsage:    "BRANCH",
				Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: `print JSON: [{"guest": G, "host": H}]`}},
				BashComplete: vmCompletion(stdio),
				Action: func(cliCtx *cli.Context) error {
					if n := cliCtx.NArg(); n != 1 {
						return usagef("port list takes BRANCH, got %d arguments", n)
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						name := cliCtx.Args().First()
						fwds, running, err := m.PortList(cliCtx.Context, name)
						if err != nil {
							return err
						}
						if cliCtx.Bool("json") {
							return writeJSON(stdio.Out, fwds)
						}
						if len(fwds) == 0 {
							fmt.Fprintf(stdio.Out, "no port forwards (hint: `agent-vm port add %s PORT`)\n", name)
							return nil
						}
						state := "live"
						if !running {
							state = "at the next start"
						}
						rows := [][]string{{"GUEST", "HOST", "STATE"}}
						for _, f := range fwds {
							rows = append(rows, []string{strconv.Itoa(f.Guest), "127.0.0.1:" + strconv.Itoa(f.Host), state})
						}
						return writeTable(stdio.Out, rows)
					})(cliCtx)
				},
			},
		},
	}
}

// portArg parses the i-th argument as a port number (the range is the
// Manager's to check).
func portArg(cliCtx *cli.Context, i int, what string) (int, error) {
	s := cliCtx.Args().Get(i)
	p, err := strconv.Atoi(s)
	if err != nil {
		return 0, usagef("%s %q is not a port number (hint: e.g. 3000)", what, s)
	}
	return p, nil
}
