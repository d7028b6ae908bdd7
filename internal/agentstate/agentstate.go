// Package agentstate is what an agent in a session is doing, as the agent
// itself says it: working, waiting for the user, or done with its turn.
//
// Claude Code runs its hooks (UserPromptSubmit, PostToolUse, Notification,
// Stop) and Codex its notify program; `agent-vm run` gives each a hook that
// runs `agent-vm agent-state` in the guest (ClaudeArgs, CodexArgs: on the
// agent's command line, so no settings file of the user's is touched).
// That command reads the hook's payload (Parse) and keeps the state as
// options of the agent's tmux session (Record), which internal/session
// reads with the sessions over the VM's existing SSH connection. An agent
// without hooks is judged by its output instead (session.Info's
// activity). The payload comes from the guest, so it is bounded, and what
// is kept of it is a short plain message: the host escapes it again
// wherever it prints it.
package agentstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// The states an agent reports.
const (
	Working = "working" // the user's prompt or a tool's result is being worked on
	Waiting = "waiting" // the agent asks the user: a permission, an answer
	Done    = "done"    // the agent finished its turn and waits for the next prompt
)

// Command is the guest command the hooks run.
const Command = "agent-state"

// The tmux session options Record sets.
const (
	StateOption   = "@agent_vm_state"
	AtOption      = "@agent_vm_state_at" // Unix seconds
	MessageOption = "@agent_vm_state_msg"
)

// MaxPayload bounds a hook's payload: past it, the payload is ignored.
// MaxMessage bounds the message kept of it, in characters.
const (
	MaxPayload = 64 << 10
	MaxMessage = 200
)

// ErrTooLarge is Parse's error for a payload over MaxPayload.
var ErrTooLarge = fmt.Errorf("the hook's payload is over %d bytes: ignored", MaxPayload)

// Report is one hook's news.
type Report struct {
	State   string
	Event   string // the hook's event, as the agent names it
	Message string // what the agent said with it, if anything (MaxMessage)
}

// payload is what Claude Code's hooks write on stdin and Codex's notify
// passes as its last argument (only the fields read here).
type payload struct {
	HookEvent string `json:"hook_event_name"` // Claude Code
	Message   string `json:"message"`         // Claude Code's Notification
	Type      string `json:"type"`            // Codex: agent-turn-complete
	Last      string `json:"last-assistant-message"`
}

// Parse reads a hook's payload.
func Parse(b []byte) (Report, error) {
	if len(b) > MaxPayload {
		return Report{}, ErrTooLarge
	}
	var p payload
	if err := json.Unmarshal(b, &p); err != nil {
		return Report{}, fmt.Errorf("the hook's payload is not JSON: %w", err)
	}
	r := Report{Event: clean(p.HookEvent, 40)}
	switch p.HookEvent {
	case "UserPromptSubmit", "PostToolUse", "PreToolUse", "SubagentStop":
		r.State = Working
	case "Notification":
		r.State, r.Message = Waiting, clean(p.Message, MaxMessage)
	case "Stop":
		r.State = Done
	case "":
		if p.Type == "agent-turn-complete" {
			r.State, r.Event, r.Message = Done, p.Type, clean(p.Last, MaxMessage)
		}
	}
	if r.State == "" {
		return Report{}, fmt.Errorf("the hook's payload says nothing agent-vm reads (event %q, type %q)", r.Event, clean(p.Type, 40))
	}
	return r, nil
}

// clean keeps the first n characters of s, on one line, without control
// or format characters.
func clean(s string, n int) string {
	var b strings.Builder
	count := 0
	for _, r := range s {
		if count == n {
			b.WriteString("…")
			break
		}
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			r = ' '
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			continue
		}
		b.WriteRune(r)
		count++
	}
	return strings.TrimSpace(b.String())
}

// Hook is the guest command's work: the payload's report kept as the state
// of the session whose pane is pane.
func Hook(ctx context.Context, payload []byte, pane string, now time.Time) error {
	r, err := Parse(payload)
	if err != nil {
		return err
	}
	return Record(ctx, execx.OS{}, pane, r, now)
}

// Record keeps r as the state of the tmux session whose pane is pane
// ($TMUX_PANE: the hook runs in the agent's session, whose server $TMUX
// names), at now.
func Record(ctx context.Context, run execx.Runner, pane string, r Report, now time.Time) error {
	if pane == "" {
		return errors.New("not in a tmux pane ($TMUX_PANE is empty): the agent runs outside agent-vm's sessions")
	}
	// tmux reads an argument that ends in ";" as the end of a command
	// (and "\;" as a ";"), so no value may end in either.
	msg := strings.TrimRight(r.Message, `;\`)
	_, err := run.Run(ctx, execx.Cmd{Path: "tmux", Args: []string{
		"set-option", "-t", pane, StateOption, r.State, ";",
		"set-option", "-t", pane, AtOption, strconv.FormatInt(now.Unix(), 10), ";",
		"set-option", "-t", pane, MessageOption, msg,
	}})
	return err
}

// hookCommand is what the hooks run in the guest.
const hookCommand = "agent-vm " + Command

// ClaudeArgs are the arguments that give Claude Code agent-vm's hooks: its
// --settings flag, whose settings join the user's (hooks from several
// sources all run).
func ClaudeArgs() []string {
	hook := []map[string]any{{"matcher": "", "hooks": []map[string]string{{"type": "command", "command": hookCommand}}}}
	hooks := map[string]any{}
	for _, ev := range []string{"UserPromptSubmit", "PostToolUse", "Notification", "Stop"} {
		hooks[ev] = hook
	}
	b, _ := json.Marshal(map[string]any{"hooks": hooks})
	return []string{"--settings", string(b)}
}

// CodexArgs are the arguments that make Codex run agent-vm's hook as its
// notify program (a -c override of its configuration).
func CodexArgs() []string {
	return []string{"-c", `notify=["agent-vm","` + Command + `"]`}
}
