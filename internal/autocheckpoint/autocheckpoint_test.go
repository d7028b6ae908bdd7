package autocheckpoint

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/state"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		every string
		keep  int
		want  *state.AutoCheckpoint
		err   string
	}{
		{"10m", 0, &state.AutoCheckpoint{Every: "10m0s", Keep: DefaultKeep}, ""},
		{"1h30m", 3, &state.AutoCheckpoint{Every: "1h30m0s", Keep: 3}, ""},
		{"0", 0, nil, ""},
		{"", 4, nil, ""},
		{"5s", 0, nil, `checkpoint interval "5s": give a duration of 10s or more`},
		{"ten minutes", 0, nil, `checkpoint interval "ten minutes"`},
		{"10m", -1, nil, "keep -1: give how many automatic checkpoints to keep"},
	} {
		got, err := Parse(tc.every, tc.keep)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Parse(%q, %d): %v, want %q", tc.every, tc.keep, err, tc.err)
		case tc.err == "" && (err != nil || (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want):
			t.Errorf("Parse(%q, %d) = %+v, %v; want %+v", tc.every, tc.keep, got, err, tc.want)
		}
	}
	if Every(nil) != 0 || Every(&state.AutoCheckpoint{Every: "bad"}) != 0 || Every(&state.AutoCheckpoint{Every: "10m"}) != 10*time.Minute {
		t.Error("Every")
	}
}

// vm is a VM as a Watch sees it, on a clock that moves a minute a look.
type vm struct {
	mu       sync.Mutex
	schedule *state.AutoCheckpoint
	state    string // its one session's
	asleep   atomic.Bool
	fail     atomic.Bool
	taken    atomic.Int32
	tries    atomic.Int32
	listed   atomic.Int32
	looks    atomic.Int32
}

func (v *vm) set(f func()) { v.mu.Lock(); defer v.mu.Unlock(); f() }

func (v *vm) run(t *testing.T) {
	clock := time.Unix(1795436800, 0)
	var cmu sync.Mutex
	w := &Watch{
		Schedule: func() *state.AutoCheckpoint { v.looks.Add(1); v.mu.Lock(); defer v.mu.Unlock(); return v.schedule },
		Sessions: func(context.Context) ([]session.Info, error) {
			v.listed.Add(1)
			v.mu.Lock()
			defer v.mu.Unlock()
			return []session.Info{{Name: "agent", State: v.state}}, nil
		},
		Asleep: v.asleep.Load,
		Take: func(context.Context) error {
			v.tries.Add(1)
			if v.fail.Load() {
				return errors.New("no space")
			}
			v.taken.Add(1)
			return nil
		},
		Log:  hclog.NewNullLogger(),
		Look: time.Millisecond,
		Now:  func() time.Time { cmu.Lock(); defer cmu.Unlock(); clock = clock.Add(time.Minute); return clock },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// afterLooks waits until the watch has looked n more times.
func (v *vm) afterLooks(t *testing.T, n int32) {
	t.Helper()
	from := v.looks.Load()
	waitFor(t, "the watch's looks", func() bool { return v.looks.Load() >= from+n })
}

// While its agent works, a checkpoint every Every; none while it waits,
// while the VM is hibernated, or with no schedule (then the sessions are
// not even read); a failed one is tried again. The test goes by the
// watch's looks, not by time.
func TestWatch(t *testing.T) {
	v := &vm{schedule: &state.AutoCheckpoint{Every: "10m", Keep: 2}, state: agentstate.Working}
	v.run(t)
	waitFor(t, "two checkpoints", func() bool { return v.taken.Load() >= 2 })

	v.set(func() { v.state = agentstate.Waiting })
	v.afterLooks(t, 30) // the one it owed, seen working before, comes within
	n := v.taken.Load()
	v.afterLooks(t, 50)
	if v.taken.Load() != n {
		t.Errorf("checkpoints taken while the agent waited: %d -> %d", n, v.taken.Load())
	}

	v.asleep.Store(true)
	v.set(func() { v.state = agentstate.Working })
	v.afterLooks(t, 50)
	if v.taken.Load() != n {
		t.Errorf("checkpoints taken while hibernated: %d -> %d", n, v.taken.Load())
	}
	v.asleep.Store(false)
	waitFor(t, "a checkpoint once awake and working", func() bool { return v.taken.Load() > n })

	v.fail.Store(true)
	tries := v.tries.Load()
	waitFor(t, "a failed checkpoint tried again", func() bool { return v.tries.Load() >= tries+2 })
	v.fail.Store(false)

	v.set(func() { v.schedule = nil })
	v.afterLooks(t, 2)
	listed, taken := v.listed.Load(), v.taken.Load()
	v.afterLooks(t, 50)
	if v.listed.Load() != listed || v.taken.Load() != taken {
		t.Errorf("with no schedule: sessions read %d more times, %d more checkpoints", v.listed.Load()-listed, v.taken.Load()-taken)
	}
}
