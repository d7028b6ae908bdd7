// Package notify tells the user when an agent in a VM starts waiting for
// them: its session's state (internal/session, as the agent's hooks or its
// output say it) turns waiting or done, or the VM's egress proxy holds a
// connection for their answer (mode ask; AGENT_VM_STATE=ask, the session
// "net"). The VM's holder watches its
// sessions over the connection it holds (Watcher, every few seconds) and
// then shows a desktop notification where this host has a session bus
// (notify-send) and runs the user's own command: `run --on-wait CMD` for
// that VM until it stops (OnWaitFile in its run directory), else on_wait in
// the user's config.toml (internal/userconfig).
//
// What the agent said comes from the guest: the command gets it, escaped,
// in its environment only (AGENT_VM_MESSAGE), never in its command line,
// and a session that keeps flipping its state is told about at most once
// every MinGap.
package notify

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/userconfig"
)

// OnWaitFile is `run --on-wait`'s command, in the VM's run directory.
const OnWaitFile = "on-wait"

// MinGap is the least time between two notifications of one session.
const MinGap = 10 * time.Second

// commandTimeout bounds the user's command.
const commandTimeout = 30 * time.Second

// SetOnWait keeps cmd as the VM's own on_wait until it stops (run
// --on-wait); "" keeps nothing new.
func SetOnWait(runDir, cmd string) error {
	if cmd == "" {
		return nil
	}
	if err := userconfig.CheckCommand(cmd); err != nil {
		return fmt.Errorf("--on-wait %w", err)
	}
	return atomicfile.Write(filepath.Join(runDir, OnWaitFile), []byte(cmd), 0o600)
}

// Watcher watches one VM's sessions.
type Watcher struct {
	Branch, VM string
	// List lists the VM's sessions as they are now.
	List func(ctx context.Context) ([]session.Info, error)
	// Asks lists the connections its proxy holds for the user's answer
	// (mode ask); nil: none are watched.
	Asks func() ([]egress.Ask, error)
	// OnWait is the user's command, read at each notification ("" none).
	OnWait func() (string, error)
	Run    execx.Runner
	Getenv func(string) string
	Log    hclog.Logger
	Every  time.Duration // 0: 5 s
	Now    func() time.Time
}

type seen struct {
	state    string
	notified time.Time
}

// Watch watches until ctx ends. The states it first sees are not news.
func (w *Watcher) Watch(ctx context.Context) {
	every := w.Every
	if every == 0 {
		every = 5 * time.Second
	}
	now := w.Now
	if now == nil {
		now = time.Now
	}
	last := map[string]seen{}
	asked := map[string]bool{} // the asks told about, by token
	first := true
	for {
		w.newAsks(ctx, asked)
		lctx, cancel := context.WithTimeout(ctx, 2*every)
		infos, err := w.List(lctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			w.Log.Debug("listing the sessions", "error", err)
		}
		if err == nil {
			t := now()
			for _, in := range infos {
				s := last[in.Name]
				if !first && waits(in.State) && s.state != in.State && t.Sub(s.notified) >= MinGap {
					w.notify(ctx, in)
					s.notified = t
				}
				s.state = in.State
				last[in.Name] = s
			}
			first = false
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func waits(state string) bool { return state == agentstate.Waiting || state == agentstate.Done }

// newAsks tells the user of the asks not told about yet, once a poll
// however many came (a guest opening many connections makes one
// notification): the VM's proxy holds a connection for their answer.
// Those ended are forgotten.
func (w *Watcher) newAsks(ctx context.Context, told map[string]bool) {
	if w.Asks == nil {
		return
	}
	asks, err := w.Asks()
	if err != nil {
		w.Log.Debug("reading the pending asks", "error", err)
		return
	}
	pending := map[string]bool{}
	var fresh []egress.Ask
	for _, a := range asks {
		pending[a.Token] = true
		if !told[a.Token] {
			told[a.Token] = true
			fresh = append(fresh, a)
		}
	}
	for tok := range told {
		if !pending[tok] {
			delete(told, tok)
		}
	}
	if len(fresh) == 0 {
		return
	}
	a := fresh[0]
	msg := fmt.Sprintf("asks to reach %s:%d (%s): agent-vm net approve --vm %s %d, or net deny", a.Host, a.Port, a.Method, w.VM, a.ID)
	if len(fresh) > 1 {
		msg += fmt.Sprintf(" (and %d more: agent-vm net pending %s)", len(fresh)-1, w.VM)
	}
	w.notify(ctx, session.Info{Name: "net", State: AskState, Message: msg})
}

// AskState is AGENT_VM_STATE when the VM's proxy holds a connection for
// the user's answer (the session is "net").
const AskState = "ask"

// notify tells the user that in's agent waits: a desktop notification,
// and the user's command.
func (w *Watcher) notify(ctx context.Context, in session.Info) {
	msg := termsafe.String(in.Message)
	what := "waits for you"
	switch in.State {
	case agentstate.Done:
		what = "is done"
	case AskState:
		what = "asks before it connects"
	}
	title := fmt.Sprintf("agent-vm: %s, session %s %s", termsafe.String(w.Branch), in.Name, what)
	if in.State == AskState {
		title = fmt.Sprintf("agent-vm: %s %s", termsafe.String(w.Branch), what)
	}
	body := msg
	if body == "" {
		body = fmt.Sprintf("agent-vm attach %s --session %s", w.VM, in.Name)
	}
	w.Log.Info("the agent "+what, "session", in.Name, "state", in.State, "from", in.StateFrom)
	Desktop(ctx, w.Run, w.Getenv, w.Log, title, body)
	cmd, err := w.OnWait()
	if err != nil {
		w.Log.Warn("reading on_wait", "error", err)
		return
	}
	if cmd == "" {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	_, err = w.Run.Run(cctx, execx.Cmd{Path: "/bin/sh", Args: []string{"-c", cmd}, Env: []string{
		"AGENT_VM_BRANCH=" + w.Branch, "AGENT_VM_VM=" + w.VM, "AGENT_VM_SESSION=" + in.Name,
		"AGENT_VM_STATE=" + in.State, "AGENT_VM_MESSAGE=" + msg,
	}})
	if err != nil {
		w.Log.Warn("the on_wait command failed", "error", err)
	}
}

// Desktop shows a desktop notification (notify-send) where the user has a
// session bus (getenv's DBUS_SESSION_BUS_ADDRESS) and notify-send is
// installed; elsewhere it does nothing. A failure is logged.
func Desktop(ctx context.Context, run execx.Runner, getenv func(string) string, log hclog.Logger, title, body string) {
	if getenv("DBUS_SESSION_BUS_ADDRESS") == "" {
		return
	}
	if _, err := run.LookPath("notify-send"); err != nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	if _, err := run.Run(cctx, execx.Cmd{Path: "notify-send", Args: []string{"--app-name=agent-vm", "--", title, body}}); err != nil {
		log.Warn("notify-send failed", "error", err)
	}
}

// OnWait is the command for the VM whose run directory is runDir: its own
// (run --on-wait), else what config gives (the user's on_wait), else "".
func OnWait(runDir string, config func() (string, error)) (string, error) {
	b, err := os.ReadFile(filepath.Join(runDir, OnWaitFile))
	switch {
	case err == nil:
		return string(b), nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", err
	}
	return config()
}
