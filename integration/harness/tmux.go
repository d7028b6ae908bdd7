package harness

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Term is a terminal on this host that a scenario drives as a user would a
// full-screen program: a tmux server of its own (a socket in the run's
// directory), one window of a given size, keys sent and the screen read.
type Term struct {
	sock string
}

// StartTerm runs argv in a new terminal of w by h, with env added to this
// program's environment, until it exits or Close.
func (s *S) StartTerm(ctx context.Context, w, h int, env []string, argv ...string) (*Term, error) {
	t := &Term{sock: filepath.Join(s.Dir(), "tmux-"+RandHex(4)+".sock")}
	args := []string{"new-session", "-d", "-x", strconv.Itoa(w), "-y", strconv.Itoa(h), "--", "env"}
	args = append(append(args, env...), argv...)
	if out, err := t.tmux(ctx, args...); err != nil {
		return nil, Failf(nil, "starting %v in tmux: %v: %s", argv, err, out)
	}
	return t, nil
}

func (t *Term) tmux(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "tmux", append([]string{"-S", t.sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
	return string(out), err
}

// Screen is what the terminal shows now.
func (t *Term) Screen(ctx context.Context) string {
	out, _ := t.tmux(ctx, "capture-pane", "-p")
	return out
}

// Keys sends keys, in tmux's names ("q", "Enter", "Down").
func (t *Term) Keys(ctx context.Context, keys ...string) error {
	_, err := t.tmux(ctx, append([]string{"send-keys"}, keys...)...)
	return err
}

// Running says whether the program still runs.
func (t *Term) Running(ctx context.Context) bool {
	out, err := t.tmux(ctx, "list-panes", "-F", "#{pane_dead}")
	return err == nil && strings.TrimSpace(out) == "0"
}

// Close ends the terminal and what runs in it, also once ctx has ended (an
// interrupted run).
func (t *Term) Close(ctx context.Context) { t.tmux(context.WithoutCancel(ctx), "kill-server") }

// Argv is the command line of agent-vm with args, on the run's state
// directory, for a program the scenario runs itself (StartTerm).
func (s *S) Argv(args ...string) []string {
	return append([]string{s.av.bin, "--state-dir", s.av.stateDir}, args...)
}
