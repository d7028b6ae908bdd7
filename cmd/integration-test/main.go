// Command integration-test drives the agent-vm binary end to end through its
// command line and reports whether this build works on this host.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/agent-vm/agent-vm/integration"
)

func main() {
	cfg, err := integration.ParseFlags(os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		os.Exit(integration.ExitCode(err))
	}
	// `integration-test | head` must not kill the run before its cleanup:
	// with SIGPIPE caught, a write to the closed pipe just fails.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // after the first signal, a second one ends the run at once
	os.Exit(integration.Run(ctx, cfg, integration.Binary()))
}
