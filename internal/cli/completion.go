package cli

import (
	_ "embed"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
)

// The shell scripts ask agent-vm itself for candidates: urfave/cli answers
// `agent-vm <words so far> --generate-bash-completion` with commands, flags
// or, for BRANCH arguments, the VMs' branches.
var (
	//go:embed completion.bash
	bashCompletion string
	//go:embed completion.zsh
	zshCompletion string
)

func completionCommand(stdio IO) *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script (bash, zsh or fish)",
		ArgsUsage: "bash|zsh|fish",
		Description: "bash: agent-vm completion bash > ~/.local/share/bash-completion/completions/agent-vm\n" +
			"zsh:  agent-vm completion zsh > \"${fpath[1]}/_agent-vm\"\n" +
			"fish: agent-vm completion fish > ~/.config/fish/completions/agent-vm.fish",
		Action: func(cliCtx *cli.Context) error {
			if cliCtx.NArg() != 1 {
				return cmdline.Usagef("completion needs one shell: bash, zsh or fish")
			}
			switch sh := cliCtx.Args().First(); sh {
			case "bash":
				_, err := fmt.Fprint(stdio.Out, bashCompletion)
				return err
			case "zsh":
				_, err := fmt.Fprint(stdio.Out, zshCompletion)
				return err
			case "fish":
				script, err := cliCtx.App.ToFishCompletion()
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(stdio.Out, script)
				return err
			default:
				return cmdline.Usagef("completion: unknown shell %q (hint: bash, zsh or fish)", sh)
			}
		},
	}
}
