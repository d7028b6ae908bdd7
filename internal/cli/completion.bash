# agent-vm bash completion: source it, or save it as
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
