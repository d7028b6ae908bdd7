// Command agent-vm gives every git branch its own isolated VM for a coding
// agent. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/agent-vm/agent-vm/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args, cli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}
