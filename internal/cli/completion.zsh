#compdef agent-vm
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
