package cli

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/vm"
)

func destroyCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "destroy",
		Usage:     "stop a VM and remove its record, disk and workspace",
		ArgsUsage: "[BRANCH]",
		Description: "Refuses when the workspace holds work that exists nowhere else (uncommitted\n" +
			"changes, untracked and ignored files, stashes, commits no remote has on any\n" +
			"branch, tag or other local ref, the same inside submodules) and says how to keep it.",
		Flags:        []cli.Flag{&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "destroy even if unsaved work would be lost"}},
		BashComplete: vmCompletion(stdio),
		Action: withManager(stdio, func(cliCtx *cli.Context, e *env, m *vm.Manager) error {
			name, err := vmName(cliCtx, m)
			if err != nil {
				return err
			}
			res, err := m.Destroy(cliCtx.Context, name, cliCtx.Bool("force"))
			var unsaved *vm.UnsavedError
			if errors.As(err, &unsaved) {
				if res != nil && res.Stopped {
					return fmt.Errorf("not destroyed (the VM was stopped first): %w", err)
				}
				return fmt.Errorf("not destroyed: %w", err)
			}
			if err != nil {
				return err
			}
			what := res.Slug
			if res.Branch != "" {
				what = "the VM of branch " + res.Branch
			}
			if res.Stopped {
				fmt.Fprintf(stdio.Out, "stopped and destroyed %s\n", what)
			} else {
				fmt.Fprintf(stdio.Out, "destroyed %s\n", what)
			}
			return nil
		}),
	}
}
