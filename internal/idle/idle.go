// Package idle hibernates a VM that nobody uses and wakes it when someone
// does.
//
// With idle_suspend set in the user's config.toml (userconfig), the VM's
// holder watches it (Watch): the VM is idle while no agent session works
// (each is waiting, done or exited, as internal/session reads it) and none
// has a client attached, no connection to any of its host ports (SSH,
// agent-mcp, its forwards: Connections) but the holder's own is in use (new,
// bytes received, more than quietSent sent: one a client keeps open and
// quiet is not), the holder relays no caller's command, and its QEMU uses
// less than MaxCPU of one host core. Idle for idle_suspend on end, the VM is
// hibernated (`agent-vm suspend --hibernate`: paused, its memory moved to
// disk; internal/guestram).
//
// A hibernated VM wakes when it is used. agent-vm's own commands that
// reach the guest (attach, exec, shell, run, sessions, mcp sync) resume it
// first (internal/vm). Everything else reaches the guest through the host
// ports QEMU listens on, which stay open while it is hibernated: a
// client's connection is taken and waits, with its bytes, while the
// guest's CPUs are stopped. The holder stays through the hibernation
// (asking nothing of the guest), and its Watch reads the host's sockets
// (Connections): every second while the VM runs (the connections it knows,
// with the bytes each received), every 125 ms while it is hibernated, when
// a connection to one of those ports that it did not know, or bytes
// received on one it knew (a client's request on its kept-alive
// connection), resumes the VM (`agent-vm resume`), and the request goes
// through.
package idle

import (
	"cmp"
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/session"
)

// MaxCPU is the share of one host core under which a VM's QEMU counts as
// idle. A TCG guest that does nothing costs QEMU several per cent; a
// build, a test run or an agent at work costs most of a core.
const MaxCPU = 0.25

// Every is how often Watch looks whether the VM is idle; tick, how often
// whether it is hibernated; every noteEvery ticks it notes the connections
// of the running VM.
const (
	Every     = 15 * time.Second
	tick      = 250 * time.Millisecond
	noteEvery = 4
)

// Watch hibernates one VM when idle and wakes it when used.
type Watch struct {
	// After is how long the VM must stay idle (idle_suspend); read at each
	// look, so a change of the user's config takes effect: 0 is off.
	After func() time.Duration
	// Ports are the VM's host ports now (Ports of its record as
	// state.Follow reads it): a forward added while the holder runs counts
	// from then on.
	Ports func() []int
	// Sessions lists the VM's agent sessions now.
	Sessions func(ctx context.Context) ([]session.Info, error)
	// Held is what the holder relays (hold.Holder.InUse): callers'
	// channels open for a while, and the local ends of its own
	// connections to the guest, which are not clients.
	Held func() (channels int, own []string)
	// CPU is the VM's QEMU's CPU time so far.
	CPU func() (time.Duration, error)
	// Asleep says whether the VM is hibernated now.
	Asleep func() bool
	// Hibernate and Wake run agent-vm's suspend --hibernate and resume.
	Hibernate, Wake func(ctx context.Context) error
	Log             hclog.Logger
	Every           time.Duration // 0: Every
	Tick            time.Duration // 0: 250 ms
	Now             func() time.Time

	used    map[string]used // the connections to its ports, as last in use
	noteErr error           // why the last note of them failed
}

// used is a connection to one of the VM's ports as it was when last in
// use: its counters then, and when.
type used struct {
	Conn
	at time.Time
}

// quietSent is how much the VM's side may send on a connection within a
// look for it to stay quiet: agent-mcp's SSE keep-alive comments on an
// MCP client's open stream are a few bytes every 25 s, sshd's replies to
// a client's keep-alive a few dozen; a download or a terminal's output is
// more.
const quietSent = 16 << 10

// Run watches until ctx ends. It looks at the VM's state every tick; while
// it runs, the connections to its ports are noted every noteEvery ticks,
// so that once it is hibernated any connection not among the last noted,
// or one that received bytes since, wakes it (one that came in the last
// second before the hibernation wakes it too: waking once too often is
// better than a client left waiting); every Every, whether it is idle.
func (w *Watch) Run(ctx context.Context) {
	every, now := cmp.Or(w.Every, Every), w.Now
	if now == nil {
		now = time.Now
	}
	if w.Tick == 0 {
		w.Tick = tick
	}
	var since time.Time // idle since; zero while in use
	told := ""          // the reason it is in use the log said last
	lastCPU, lastAt, next := time.Duration(-1), now(), now().Add(every)
	var known map[string]Conn // the connections while it ran
	for n := 0; ; n++ {
		if w.Asleep() {
			known = w.wakeOnConnection(ctx, known)
			since, lastCPU = time.Time{}, -1
		} else if n%noteEvery == 0 {
			c, err := Connections(w.Ports())
			if err == nil {
				known = c
				w.note(c, now())
			}
			w.noteErr = err
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(w.Tick):
		}
		t := now()
		if t.Before(next) {
			continue
		}
		next = t.Add(every)
		// The CPU is read at every look, so that the first look after
		// idle_suspend is set can tell an idle VM already.
		cpu, err := w.CPU()
		if err != nil {
			cpu = -1
		}
		prevCPU, prevAt := lastCPU, lastAt
		lastCPU, lastAt = cpu, t
		after := w.After()
		if after <= 0 || w.Asleep() {
			since = time.Time{}
			continue
		}
		// In use since the look before (the connections are noted every
		// noteEvery ticks, so from a note before it).
		why := w.inUse(ctx, cpu, prevCPU, t.Sub(prevAt), prevAt.Add(-noteEvery*w.Tick))
		switch {
		case why != "":
			// Told once for each new reason: the log says why a VM
			// does not hibernate without a line a look (the first
			// look's unknown CPU use says nothing).
			if why != told && why != cpuUnknown {
				w.Log.Info("kept awake", "why", why, "idle_suspend", after)
				told = why
			}
			since = time.Time{}
		case since.IsZero():
			since = t
		case t.Sub(since) >= after:
			w.Log.Info("idle; hibernating", "idle_for", t.Sub(since).Round(time.Second))
			told = ""
			if err := w.Hibernate(ctx); err != nil {
				w.Log.Warn("the idle VM did not hibernate", "error", err)
			}
			since = time.Time{}
		}
	}
}

// note records the connections to the VM's ports seen at t: one is in
// use at t when it is new, received bytes, sent more than quietSent since
// it last was, or its counters are not known.
func (w *Watch) note(conns map[string]Conn, t time.Time) {
	next := make(map[string]used, len(conns))
	for k, c := range conns {
		u, ok := w.used[k]
		if !ok || !c.Counted || c.Received > u.Received || c.Sent >= u.Sent+quietSent {
			u = used{Conn: c, at: t}
		}
		next[k] = u
	}
	w.used = next
}

// Clients is how many connections to the VM's host ports, besides the
// holder's own, were in use (note) since, and how many callers' commands
// the holder relays. A client that keeps a connection open and quiet (an
// MCP client's stream, an idle ssh session) is not counted: a request
// on it wakes the VM (wakeOnConnection).
func (w *Watch) Clients(since time.Time) (int, error) {
	if w.noteErr != nil {
		return 0, w.noteErr
	}
	channels, own := w.Held()
	n := channels
	for k, u := range w.used {
		if !holders(k, own) && !u.at.Before(since) {
			n++
		}
	}
	return n, nil
}

// cpuUnknown is inUse's answer before two readings of the CPU time.
const cpuUnknown = "its CPU use is not known yet"

// inUse says why the VM is in use ("" when idle): cpu and last are QEMU's
// CPU time now and a span ago (-1 when unknown: in use).
func (w *Watch) inUse(ctx context.Context, cpu, last, span time.Duration, since time.Time) string {
	switch {
	case cpu < 0 || last < 0 || span <= 0:
		return cpuUnknown
	case float64(cpu-last) > MaxCPU*float64(span):
		return "its CPU is busy"
	}
	if n, err := w.Clients(since); err != nil || n > 0 {
		return "a client is connected"
	}
	lctx, cancel := context.WithTimeout(ctx, Every)
	defer cancel()
	infos, err := w.Sessions(lctx)
	if err != nil {
		return "its sessions cannot be read"
	}
	for _, in := range infos {
		if in.Attached > 0 {
			return "a client is attached to session " + in.Name
		}
		if !in.Exited && in.State != agentstate.Waiting && in.State != agentstate.Done {
			return "session " + in.Name + " works"
		}
	}
	return ""
}
