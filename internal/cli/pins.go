package cli

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
)

// pinSources is setup's pins step: the package sources resolved, the pins
// recorded (not with --no-pins) and printed, the running VMs given them.
func pinSources(cliCtx *cli.Context, stdio IO, m *vm.Manager) error {
	rep, refreshed, err := m.PinSources(cliCtx.Context, !cliCtx.Bool("no-pins"))
	for _, l := range rep.Lines() {
		fmt.Fprintln(stdio.Out, l)
	}
	if len(refreshed) > 0 {
		fmt.Fprintf(stdio.Out, "the running VMs' egress proxies have the new pins: %s\n", strings.Join(refreshed, ", "))
	}
	return err
}
