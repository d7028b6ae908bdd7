// Command agent-vm gives every git branch its own isolated VM for a coding
// agent. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/cli"
	"github.com/agent-vm/agent-vm/internal/sharejail"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == sharejail.Command {
		// Not a command: the launcher's virtiofsd jail (see sharejail).
		os.Exit(sharejail.Main(os.Args[2:], os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args, cli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}
