package cli

import (
	"bufio"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/hosts"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// hostCommand is `host add|link|list|rm|doctor`: the libvirt hosts VMs may be
// placed on (internal/hosts), with `create --host`.
func hostCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:  "host",
		Usage: "libvirt hosts VMs may run on, e.g. a bigger machine over SSH (add, link, list, rm, doctor)",
		Description: "A host is a short NAME and a libvirt URI: qemu:///system (this machine's libvirtd), or\n" +
			"qemu+ssh://USER@SERVER/system for another machine that USER can ssh to without a prompt (a key in\n" +
			"ssh-agent, or keyfile=/path/to/key; the server's host key already in ~/.ssh/known_hosts). They are\n" +
			"kept in $XDG_CONFIG_HOME/agent-vm/hosts (~/.config/agent-vm/hosts). host link NAME sets up\n" +
			"agent-vm's own SSH link to a qemu+ssh host (its host key pinned, a key of agent-vm's), which placing\n" +
			"VMs there uses; log in as root there. host doctor NAME checks what agent-vm needs there.\n" +
			"agent-vm create BRANCH --host NAME then places a VM on it.",
		Subcommands: []*cli.Command{
			{
				Name:      "add",
				Usage:     "register a libvirt host under a short name",
				ArgsUsage: "NAME URI",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "dir", Usage: "agent-vm's directory on a qemu+ssh host, for the files of VMs placed there", DefaultText: "/var/lib/agent-vm"},
				},
				Action: func(cliCtx *cli.Context) error {
					if cliCtx.NArg() != 2 {
						return cmdline.Usagef("host add takes NAME URI, got %d arguments (hint: `agent-vm host add big qemu+ssh://you@server/system`)", cliCtx.NArg())
					}
					return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
						h, err := m.Hosts.AddWith(cliCtx.Context, cliCtx.Args().Get(0), cliCtx.Args().Get(1), hosts.AddOptions{Dir: cliCtx.String("dir")})
						if err != nil {
							return err
						}
						next := "`agent-vm host doctor " + h.Name + "` checks it"
						if u, err := hosts.ParseURI(h.URI); err == nil && u.Remote() {
							next = "`agent-vm host link " + h.Name + "` sets up agent-vm's own SSH link to it, then `agent-vm host doctor " + h.Name + "` checks it"
						}
						fmt.Fprintf(stdio.Out, "added host %s (%s) (hint: %s)\n", h.Name, termsafe.String(h.URI), next)
						return nil
					})(cliCtx)
				},
			},
			{
				Name:  "link",
				Usage: "set up agent-vm's own SSH link to a qemu+ssh host: pin its host key, make agent-vm's key for it",
				Description: "Reads the host's ed25519 host key from its sshd and pins it once you confirm its fingerprint\n" +
					"(--host-key, or a prompt at a terminal; check it on the host with\n" +
					"ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then makes a key pair of agent-vm's for the host\n" +
					"(kept with the host's entry, 0600) and prints its public half, for the host's authorized_keys.\n" +
					"agent-vm then reaches the host without your ~/.ssh, agent or ssh_config. host doctor checks it.",
				ArgsUsage: "NAME",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "host-key", Usage: "the host key's fingerprint you checked, SHA256:..."},
					&cli.BoolFlag{Name: "json", Usage: "print JSON"},
				},
				Action: withHostName(stdio, func(cliCtx *cli.Context, m *vm.Manager, name string) error {
					opts := hosts.LinkOptions{HostKey: cliCtx.String("host-key"), Confirm: askHostKey(stdio)}
					res, err := m.Hosts.LinkHost(cliCtx.Context, name, opts)
					if err != nil {
						return err
					}
					if cliCtx.Bool("json") {
						return writeJSON(stdio.Out, res)
					}
					fmt.Fprintf(stdio.Out, "pinned host %s's key %s (%s)\n", name, res.Link.Fingerprint, res.Link.Addr)
					what := "agent-vm's key for it (made now)"
					if !res.NewKey {
						what = "agent-vm's key for it (kept from before)"
					}
					fmt.Fprintf(stdio.Out, "%s, %s.pub:\n  %s\nadd that line to ~%s/.ssh/authorized_keys on the host, then `agent-vm host doctor %s`\n",
						what, res.Link.KeyFile, res.PublicKey, termsafe.String(res.Link.User), name)
					return nil
				}),
			},
			{
				Name:    "list",
				Aliases: []string{"ls"},
				Usage:   "list the hosts: name, URI, when added",
				Flags:   []cli.Flag{&cli.BoolFlag{Name: "json", Usage: `print JSON: [{"name", "uri", "added"}]`}},
				Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
					if err := cmdline.NoArgs(cliCtx); err != nil {
						return err
					}
					return hostList(cliCtx, stdio, m)
				}),
			},
			{
				Name:      "rm",
				Usage:     "forget a host",
				ArgsUsage: "NAME",
				Action: withHostName(stdio, func(cliCtx *cli.Context, m *vm.Manager, name string) error {
					if err := m.RemoveHost(cliCtx.Context, name); err != nil {
						return err
					}
					fmt.Fprintf(stdio.Out, "removed host %s\n", name)
					return nil
				}),
			},
			{
				Name:      "doctor",
				Usage:     "check a host: libvirt reachable, KVM, CPUs and memory, agent-vm's storage pool, dnsmasq and nft, virtiofsd; exit 1 if a check fails",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
				Action: withHostName(stdio, func(cliCtx *cli.Context, m *vm.Manager, name string) error {
					r, err := m.HostDoctor(cliCtx.Context, name)
					if err != nil {
						return err
					}
					if cliCtx.Bool("json") {
						if err := writeJSON(stdio.Out, r); err != nil {
							return err
						}
					} else {
						printHostChecks(stdio, r)
					}
					return r.Err()
				}),
			},
		},
	}
}

// askHostKey asks on the terminal whether a fingerprint is the host's;
// without one there is no one to ask (host link then wants --host-key).
func askHostKey(stdio IO) func(addr, fingerprint string) (bool, error) {
	if stdio.In == nil || !term.IsTerminal(int(stdio.In.Fd())) {
		return nil
	}
	return func(addr, fingerprint string) (bool, error) {
		fmt.Fprintf(stdio.Err, "%s presents the host key\n  %s\nCheck it on the host (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub). Is it the host's? [y/N] ", termsafe.String(addr), fingerprint)
		line, err := bufio.NewReader(stdio.In).ReadString('\n')
		if err != nil && line == "" {
			return false, fmt.Errorf("reading the answer: %w", err)
		}
		a := strings.ToLower(strings.TrimSpace(line))
		return a == "y" || a == "yes", nil
	}
}

// withHostName is the action of host rm, link and doctor: their one NAME
// argument is checked before the Manager opens.
func withHostName(stdio IO, f func(cliCtx *cli.Context, m *vm.Manager, name string) error) cli.ActionFunc {
	return func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return cmdline.Usagef("host %s takes one NAME, got %d arguments (hint: `agent-vm host list` shows the hosts)", cliCtx.Command.Name, cliCtx.NArg())
		}
		return withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			return f(cliCtx, m, cliCtx.Args().First())
		})(cliCtx)
	}
}

// hostList is `host list [--json]`. A damaged host file is an error after
// the others are listed.
func hostList(cliCtx *cli.Context, stdio IO, m *vm.Manager) error {
	all, listErr := m.Hosts.List()
	if all == nil {
		all = []hosts.Host{}
	}
	if cliCtx.Bool("json") {
		return errors.Join(writeJSON(stdio.Out, all), listErr)
	}
	if len(all) == 0 && listErr == nil {
		fmt.Fprintln(stdio.Out, "no hosts (hint: `agent-vm host add NAME URI`, e.g. `agent-vm host add big qemu+ssh://you@server/system`)")
		return nil
	}
	table := [][]string{{"NAME", "URI", "ADDED"}}
	for _, h := range all {
		table = append(table, []string{h.Name, termsafe.String(h.URI), h.Added.Local().Format(time.DateTime)})
	}
	return errors.Join(writeTable(stdio.Out, table), listErr)
}

// printHostChecks prints host doctor's lines, as doctor prints its own.
func printHostChecks(stdio IO, r hosts.Report) {
	fmt.Fprintf(stdio.Out, "host %s (%s)\n", r.Host, termsafe.String(r.URI))
	for _, c := range r.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "--  "
		}
		fmt.Fprintf(stdio.Out, "%s%-22s %s\n", mark, c.Name, termsafe.String(c.Detail))
		if c.Hint != "" {
			fmt.Fprintf(stdio.Out, "    %-22s hint: %s\n", "", termsafe.String(c.Hint))
		}
	}
}
