package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/cmdline"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// openURLTimeout bounds a request to the host's URL-opening bridge: the host reads
// for at most bridge.ReadTimeout and waits briefly for its opener.
const openURLTimeout = 30 * time.Second

// openURLCommand runs in the guest, for xdg-open, sensible-browser,
// x-www-browser, www-browser and $BROWSER (the guest's shims run it with
// their arguments): it asks the host to open the URL through the VM's
// URL-opening bridge (internal/bridge).
func openURLCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name: "open-url", Hidden: true, Usage: "in a guest: ask the host to open a URL (what xdg-open and $BROWSER run)", ArgsUsage: "URL",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Usage: "the URL-opening bridge's socket (default: the guest's, where the host serves it)"},
		},
		Action: func(cliCtx *cli.Context) error {
			if cliCtx.NArg() != 1 {
				return cmdline.Usagef("open-url takes one URL, got %d arguments (hint: agent-vm open-url https://...)", cliCtx.NArg())
			}
			ctx, cancel := context.WithTimeout(cliCtx.Context, openURLTimeout)
			defer cancel()
			a, err := bridge.AskOpen(ctx, cliCtx.String("socket"), cliCtx.Args().First())
			if errors.Is(err, bridge.ErrNoOpener) {
				return fmt.Errorf("opening URLs on the host is off for this VM; on the host, run: agent-vm browser %s --open-urls", thisVM())
			}
			if err != nil {
				return err
			}
			if a.Refused != "" {
				return errors.New(a.String())
			}
			_, err = fmt.Fprintf(stdio.Err, "agent-vm: %s\n", a)
			return err
		},
	}
}

// thisVM is the VM's name as the guest knows it: its host name, which is
// the VM's slug (the host resolves a slug as it does a branch); BRANCH when
// it cannot tell.
func thisVM() string {
	name, err := os.Hostname()
	if err != nil || name == "" {
		return "BRANCH"
	}
	return termsafe.String(name)
}
