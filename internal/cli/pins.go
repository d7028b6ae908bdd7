package cli

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/pins"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// pinSources is setup's pins step: the package sources resolved, the pins
// recorded (not with --no-pins) and printed, the running VMs given them.
func pinSources(cliCtx *cli.Context, stdio IO, m *vm.Manager) error {
	rep, refreshed, err := m.PinSources(cliCtx.Context, !cliCtx.Bool("no-pins"))
	printPinReport(stdio.Out, rep)
	if len(refreshed) > 0 {
		fmt.Fprintf(stdio.Out, "the running VMs' egress proxies have the new pins: %s\n", strings.Join(refreshed, ", "))
	}
	return err
}

// printPinReport says what setup's pins step found and did, one line a
// pin.
func printPinReport(w io.Writer, r hostsetup.PinReport) {
	unchanged := 0
	for _, c := range r.Changes {
		p, why := termsafe.String(c.Pin.String()), termsafe.String(c.Why)
		switch {
		case c.Kind == pins.Unchanged:
			unchanged++
		case c.Kind == pins.Added && r.Recorded:
			fmt.Fprintf(w, "pinned: %s (%s: taken as this network's gateway or mirror; every VM's egress proxy now connects there for that name alone)\n", p, why)
		case c.Kind == pins.Added:
			fmt.Fprintf(w, "found: %s (%s; not pinned: --no-pins)\n", p, why)
		case c.Kind == pins.Dropped && r.Recorded:
			fmt.Fprintf(w, "unpinned: %s (%s)\n", p, why)
		case c.Kind == pins.Dropped:
			fmt.Fprintf(w, "pinned still: %s, though %s (--no-pins)\n", p, why)
		case c.Kind == pins.Kept:
			fmt.Fprintf(w, "kept: %s (%s)\n", p, why)
		case c.Kind == pins.Refused:
			fmt.Fprintf(w, "not pinned: %s (%s; should %s's mirror be this host, `agent-vm net allow --vm BRANCH %s` lets one VM reach it there)\n",
				p, why, termsafe.String(c.Pin.Name), c.Pin.Addr)
		}
	}
	if unchanged > 0 {
		fmt.Fprintf(w, "pinned already: %d (`agent-vm doctor` lists the pins)\n", unchanged)
	}
	if !r.Recorded && slices.ContainsFunc(r.Changes, func(c pins.Change) bool { return c.Kind == pins.Added || c.Kind == pins.Dropped }) {
		fmt.Fprintf(w, "nothing recorded (--no-pins); the pins in force stay as they are (%s). Without a pin, a VM reaches such an address only with `agent-vm net allow --vm BRANCH ADDRESS`, and then under every name it may reach\n", r.File)
	}
}

// pinLines are the pins as doctor and net show print them: one line an
// address, with the names it is pinned for.
func pinLines(ps []egress.Pin) []string {
	var addrs []netip.Addr
	names := map[netip.Addr][]string{}
	for _, p := range ps {
		if _, ok := names[p.Addr]; !ok {
			addrs = append(addrs, p.Addr)
		}
		names[p.Addr] = append(names[p.Addr], termsafe.String(p.Name))
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, fmt.Sprintf("%s for %s", a, strings.Join(names[a], ", ")))
	}
	return out
}
