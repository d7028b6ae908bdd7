// Package autocheckpoint takes checkpoints of a VM while its agent works.
//
// With an auto_checkpoint schedule in the VM's record (run
// --checkpoint-every, checkpoint --every), the VM's holder runs a Watch:
// it looks at the agent sessions every Look, and once Every has passed
// since the last checkpoint (or since the watch began) and a session was
// seen working in that time (as internal/session reads the agent's
// state), it takes one (`agent-vm checkpoint --auto`: named auto-TIME,
// the newest Keep of the automatic ones kept; internal/fork). Nothing is
// taken while no agent works (nothing new to keep) or while the VM is
// hibernated, and a checkpoint that fails is tried again at the next
// Every.
package autocheckpoint

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/state"
)

// LogName is the log, in the VM's logs directory, of the checkpoints the
// holder takes (`agent-vm checkpoint --auto`'s output).
const LogName = "checkpoint.log"

// Defaults and bounds of a schedule.
const (
	DefaultKeep = 5
	MinEvery    = 10 * time.Second
	// Look is how often Watch looks at the sessions.
	Look = 15 * time.Second
)

// Parse reads a schedule: every a Go duration ("10m"; "0" or "" turns it
// off, nil), keep how many automatic checkpoints to keep (0: DefaultKeep).
// Its errors name the value and what to give.
func Parse(every string, keep int) (*state.AutoCheckpoint, error) {
	if every == "" || every == "0" {
		return nil, nil
	}
	d, err := time.ParseDuration(every)
	if err != nil || d < MinEvery {
		return nil, fmt.Errorf("checkpoint interval %q: give a duration of %s or more, such as 10m or 1h (0 turns it off)", every, MinEvery)
	}
	if keep < 0 {
		return nil, fmt.Errorf("keep %d: give how many automatic checkpoints to keep, 1 or more (default %d)", keep, DefaultKeep)
	}
	return &state.AutoCheckpoint{Every: d.String(), Keep: cmp.Or(keep, DefaultKeep)}, nil
}

// Every is a's interval, 0 when a is nil or does not parse.
func Every(a *state.AutoCheckpoint) time.Duration {
	if a == nil {
		return 0
	}
	d, err := time.ParseDuration(a.Every)
	if err != nil || d < MinEvery {
		return 0
	}
	return d
}

// Watch takes the checkpoints of one VM.
type Watch struct {
	// Schedule is the VM's schedule now (its record's; nil: none), read at
	// each look, so that a change applies at once.
	Schedule func() *state.AutoCheckpoint
	// Sessions lists the VM's agent sessions now.
	Sessions func(ctx context.Context) ([]session.Info, error)
	// Asleep says whether the VM is hibernated now.
	Asleep func() bool
	// Take takes an automatic checkpoint (agent-vm checkpoint --auto).
	Take func(ctx context.Context) error
	Log  hclog.Logger
	Look time.Duration // 0: Look
	Now  func() time.Time
}

// Run watches until ctx ends.
func (w *Watch) Run(ctx context.Context) {
	now := w.Now
	if now == nil {
		now = time.Now
	}
	last, worked := now(), false // since the last checkpoint
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(cmp.Or(w.Look, Look)):
		}
		every := Every(w.Schedule())
		if every == 0 || w.Asleep() {
			last, worked = now(), false // a schedule set later counts from then
			continue
		}
		if !worked {
			worked = w.working(ctx)
		}
		if !worked || now().Sub(last) < every {
			continue
		}
		if err := w.Take(ctx); err != nil {
			w.Log.Warn("the automatic checkpoint failed; trying again in "+every.String(), "error", err)
		} else {
			w.Log.Info("took an automatic checkpoint")
		}
		last, worked = now(), false
	}
}

// working says whether an agent session works now.
func (w *Watch) working(ctx context.Context) bool {
	lctx, cancel := context.WithTimeout(ctx, Look)
	defer cancel()
	infos, err := w.Sessions(lctx)
	if err != nil {
		w.Log.Debug("reading the sessions", "error", err)
		return false
	}
	for _, in := range infos {
		if !in.Exited && in.State == agentstate.Working {
			return true
		}
	}
	return false
}
