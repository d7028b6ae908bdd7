package cli

import (
	"fmt"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/forward"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// portCommand is `port add|rm|list` (the VM's own port forwards, guest
// to host) and `port expose|unexpose` (host ports the guest reaches).
func portCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "port",
		Usage: "a VM's ports: forward guest ports to the host (add, rm, list); let the VM reach host ports (expose, unexpose)",
		Description: "A forward is live while the VM runs and kept in its record, so every start applies it.\n" +
			"The server in the guest must listen on 0.0.0.0 (or the guest's address), not 127.0.0.1.\n\n" +
			"The guest reaches an exposed host port at 10.0.2.100 on the same port number; nothing else of\n" +
			"the host answers it. mcp sync exposes the ports of the host's HTTP MCP servers itself.\n" +
			"A port exposed while the VM runs opens at its next start; unexpose closes it at once.\n" +
			"agent-vm net show lists the exposed ports.",
		Subcommands: []*cli.Command{
			{
				Name:      "add",
				Usage:     "forward GUEST_PORT to 127.0.0.1:HOST_PORT (default: the same number if free, else a free port)",
				ArgsUsage: "GUEST_PORT [HOST_PORT]",
				Flags:     []cli.Flag{vmFlag()},
				Action: func(cliCtx *cli.Context) error {
					if n := cliCtx.NArg(); n < 1 || n > 3 || n == 3 && cliCtx.IsSet("vm") {
						return cmdline.Usagef("port add takes GUEST_PORT [HOST_PORT], got %d arguments", n)
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						// The old spelling led with BRANCH: three words, or
						// two whose first is not a port number.
						old := func(args []string) bool { return len(args) == 3 || len(args) == 2 && !isNumber(args[0]) }
						branch, args, err := vmAndArgs(cliCtx, stdio, m, old)
						if err != nil {
							return err
						}
						guest, err := portArg(args, 0, "GUEST_PORT")
						if err != nil {
							return err
						}
						host := 0
						if len(args) == 2 {
							if host, err = portArg(args, 1, "HOST_PORT"); err != nil {
								return err
							}
						}
						ch, err := forward.Add(cliCtx.Context, m, branch, guest, host, e.log)
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
							fmt.Fprintf(stdio.Out, "guest port %d of %s will be forwarded to 127.0.0.1:%d: the VM is not running, so the forward applies at its next start (agent-vm start %s)\n", f.Guest, ch.Slug, f.Host, ch.Slug)
						}
						return nil
					})(cliCtx)
				},
			},
			{
				Name:      "rm",
				Usage:     "end the forward of GUEST_PORT",
				ArgsUsage: "GUEST_PORT",
				Flags:     []cli.Flag{vmFlag()},
				Action: func(cliCtx *cli.Context) error {
					if n := cliCtx.NArg(); n != 1 && !(n == 2 && !cliCtx.IsSet("vm")) {
						return cmdline.Usagef("port rm takes GUEST_PORT, got %d arguments", n)
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						branch, guest, err := vmAndPort(cliCtx, stdio, m, "GUEST_PORT")
						if err != nil {
							return err
						}
						ch, err := forward.Remove(cliCtx.Context, m, branch, guest, e.log)
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
				ArgsUsage:    "[BRANCH]",
				Flags:        []cli.Flag{&cli.BoolFlag{Name: "json", Usage: `print JSON: [{"guest": G, "host": H}]`}},
				BashComplete: vmCompletion(stdio),
				Action: func(cliCtx *cli.Context) error {
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						name, err := vmName(cliCtx, m)
						if err != nil {
							return err
						}
						fwds, running, err := forward.List(cliCtx.Context, m, name)
						if err != nil {
							return err
						}
						if cliCtx.Bool("json") {
							return writeJSON(stdio.Out, fwds)
						}
						if len(fwds) == 0 {
							fmt.Fprintf(stdio.Out, "no port forwards (hint: agent-vm port add --vm %s PORT)\n", name)
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
			{
				Name:      "expose",
				Usage:     "let the VM reach HOST_PORT of the host's 127.0.0.1, at 10.0.2.100:HOST_PORT",
				ArgsUsage: "HOST_PORT",
				Flags:     []cli.Flag{vmFlag()},
				Action: func(cliCtx *cli.Context) error {
					return expose(cliCtx, stdio, "port expose", false)
				},
			},
			{
				Name:      "unexpose",
				Usage:     "close HOST_PORT to the VM again",
				ArgsUsage: "HOST_PORT",
				Flags:     []cli.Flag{vmFlag()},
				Action: func(cliCtx *cli.Context) error {
					return expose(cliCtx, stdio, "port unexpose", true)
				},
			},
		},
	}
}

// exposeCommand is `expose [--vm BRANCH] HOST_PORT [--remove]`, which port
// expose and unexpose replaced: hidden, kept for the scripts that call it.
func exposeCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "expose",
		Hidden:    true,
		Usage:     "port expose, or with --remove port unexpose",
		ArgsUsage: "HOST_PORT",
		Flags:     []cli.Flag{&cli.BoolFlag{Name: "remove", Aliases: []string{"rm"}, Usage: "close the port again"}, vmFlag()},
		Action: func(cliCtx *cli.Context) error {
			return expose(cliCtx, stdio, "expose", cliCtx.Bool("remove"))
		},
	}
}

// expose is port expose (or with remove, unexpose) [--vm BRANCH]
// HOST_PORT; verb names the command in usage errors.
func expose(cliCtx *cli.Context, stdio IO, verb string, remove bool) error {
	if n := cliCtx.NArg(); n != 1 && !(n == 2 && !cliCtx.IsSet("vm")) {
		return cmdline.Usagef("%s takes HOST_PORT, got %d arguments", verb, n)
	}
	return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
		name, port, err := vmAndPort(cliCtx, stdio, m, "HOST_PORT")
		if err != nil {
			return err
		}
		ch, err := netpolicy.Expose(cliCtx.Context, m, name, port, remove)
		if err != nil {
			return err
		}
		branch := termsafe.String(ch.Branch)
		switch {
		case ch.Removed:
			fmt.Fprintf(stdio.Out, "%s no longer reaches host port %d\n", branch, port)
		case ch.Unchanged:
			fmt.Fprintf(stdio.Out, "%s already reaches host port %d at %s; nothing changed\n", branch, port, ch.GuestAddr)
		case ch.Restart:
			fmt.Fprintf(stdio.Out, "%s will reach host port %d at %s from its next start (the VM runs; agent-vm restart %s)\n", branch, port, ch.GuestAddr, branch)
		default:
			fmt.Fprintf(stdio.Out, "%s reaches host port %d at %s\n", branch, port, ch.GuestAddr)
		}
		return nil
	})(cliCtx)
}

// portArg parses args[i] as a port number (the range is the Manager's to
// check).
func portArg(args []string, i int, what string) (int, error) {
	p, err := strconv.Atoi(args[i])
	if err != nil {
		return 0, cmdline.Usagef("%s %q is not a port number (hint: e.g. 3000)", what, args[i])
	}
	return p, nil
}

// isNumber says whether s is a decimal number.
func isNumber(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}
