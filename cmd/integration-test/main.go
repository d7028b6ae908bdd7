// Command integration-test drives the agent-vm binary end to end through its
// command line and reports whether this build works on this host. It wires
// the scenarios into the harness that runs them.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/agent-vm/agent-vm/integration/harness"
	"github.com/agent-vm/agent-vm/integration/scenario"
)

func main() {
	cfg, err := harness.ParseFlags(os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		os.Exit(harness.ExitCode(err))
	}
	// `integration-test | head` must not kill the run before its cleanup:
	// with SIGPIPE caught, a write to the closed pipe just fails.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // after the first signal, a second one ends the run at once
	os.Exit(harness.Run(ctx, cfg, suite()))
}

// suite is what the binary runs: every scenario, and the run's template.
func suite() harness.Suite {
	return harness.Suite{Scenarios: scenario.All(), Template: scenario.Template}
}
