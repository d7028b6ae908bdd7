package cli

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/cmdline"
)

// The shell scripts ask agent-vm itself for candidates: urfave/cli answers
// `agent-vm <words so far> --generate-bash-completion` with commands, flags
// or, for BRANCH arguments, the VMs' branches.
const bashCompletion = `# agent-vm bash completion: source it, or save it as
# /etc/bash_completion.d/agent-vm (or ~/.local/share/bash-completion/completions/agent-vm).
_agent_vm_complete() {
    local cur words
    cur="${COMP_WORDS[COMP_CWORD]}"
    if [[ "$cur" == -* ]]; then
        words=$("${COMP_WORDS[@]:0:$COMP_CWORD}" "$cur" --generate-bash-completion 2>/dev/null)
    else
        words=$("${COMP_WORDS[@]:0:$COMP_CWORD}" --generate-bash-completion 2>/dev/null)
    fi
    local IFS=$'\n'
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o bashdefault -o default -F _agent_vm_complete agent-vm
`

const zshCompletion = `#compdef agent-vm
# agent-vm zsh completion: save as _agent-vm in a directory on $fpath.
_agent_vm() {
    local -a candidates
    local cur=${words[CURRENT]}
    local -a prev=("${(@)words[1,CURRENT-1]}")
    if [[ "$cur" == -* ]]; then
        candidates=("${(@f)$(_CLI_ZSH_AUTOCOMPLETE_HACK=1 ${prev[@]} $cur --generate-bash-completion 2>/dev/null)}")
    else
        candidates=("${(@f)$(_CLI_ZSH_AUTOCOMPLETE_HACK=1 ${prev[@]} --generate-bash-completion 2>/dev/null)}")
    fi
    if [[ -n "${candidates[1]}" ]]; then
        _describe 'agent-vm' candidates
    else
        _files
    fi
}
compdef _agent_vm agent-vm
`

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
