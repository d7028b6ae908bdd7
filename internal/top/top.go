// Package top is `agent-vm top`: one screen for every VM of the state
// directory, whatever its repository, with what its agents are doing, and
// keys that act on the selected one.
//
// A Gatherer takes a Snapshot: each VM's state as status has it, its agent
// sessions and the last line of the first one's screen (over the VM's SSH
// connection, through its holder), its QEMU's processor use since the last
// snapshot and its memory as PSS (what it costs the host: shared pages
// divided), its connections through the egress proxy in the last minute
// and the refused ones, and the connections mode ask holds for an answer.
// The screen (ui.go) shows snapshots as they come and runs agent-vm's own
// commands for the keys: what they do and say is the command line's.
package top

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/guestconn"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// VMs is what top needs of agent-vm's VMs; vm's Manager has it.
type VMs interface {
	netpolicy.LogPuller
	// List lists the state directory's VMs.
	List(ctx context.Context) ([]state.Entry, error)
	// Status is a VM's status, as `status` shows it (probe: ask the guest
	// whether agent-mcp is healthy).
	Status(ctx context.Context, e state.Entry, probe bool) vminfo.Info
}

// Row is one VM on the screen.
type Row struct {
	VM      string `json:"vm"` // the VM's name (its slug)
	Branch  string `json:"branch"`
	Repo    string `json:"repo"` // the repository it was made from
	Backend string `json:"backend"`
	State   string `json:"state"`
	// Suspend says how a suspended VM keeps its memory (vminfo.Info's).
	Suspend string `json:"suspend,omitempty"`
	Live
	// Err is what could not be read of it.
	Err string `json:"error,omitempty"`
}

// Live is what a VM is doing, beside its status: what top shows and
// `list --json` adds to each VM's status.
type Live struct {
	// Sessions are its agent sessions (running VMs on this machine), Agent
	// the most pressing of their states (waiting, done, working, exited)
	// and Last the last line on the screen of the session that has it.
	Sessions []session.Info `json:"sessions"`
	Agent    string         `json:"agent_state"`
	Last     string         `json:"last_line,omitempty"`
	// CPU is its QEMU's processor use since the last snapshot, in percent
	// of one CPU (-1: not known yet), PSS its memory in bytes (-1: not
	// known).
	CPU float64 `json:"cpu_percent"`
	PSS int64   `json:"pss_bytes"`
	// Conns are its connections through the egress proxy in the last
	// minute, Refused those of them refused.
	Conns   int `json:"connections_1m"`
	Refused int `json:"refused_1m"`
	// Asks are the connections mode ask holds for an answer, oldest first.
	Asks []egress.Ask `json:"asks"`
}

// Snapshot is every VM at one moment.
type Snapshot struct {
	Taken time.Time `json:"taken"`
	Rows  []Row     `json:"vms"`
}

// Gatherer takes snapshots; it remembers each QEMU's processor time to say
// how much it used since.
type Gatherer struct {
	VMs VMs
	Now func() time.Time // nil: time.Now
	mu  sync.Mutex       // one snapshot at a time: the screen asks on a tick and after a key's command
	cpu map[int]sample
}

type sample struct {
	at   time.Time
	used time.Duration
}

// Gather takes a snapshot.
func (g *Gatherer) Gather(ctx context.Context) (Snapshot, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now
	if g.Now != nil {
		now = g.Now
	}
	es, err := g.VMs.List(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	snap := Snapshot{Taken: now()}
	cpu := map[int]sample{}
	for _, e := range es {
		snap.Rows = append(snap.Rows, g.row(ctx, e, snap.Taken, cpu))
	}
	g.cpu = cpu
	slices.SortStableFunc(snap.Rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Repo, b.Repo), cmp.Compare(a.Branch, b.Branch))
	})
	return snap, nil
}

func (g *Gatherer) row(ctx context.Context, e state.Entry, now time.Time, cpu map[int]sample) Row {
	i := g.VMs.Status(ctx, e, false)
	r := Row{VM: i.Slug, Branch: i.Branch, Repo: i.Git.Source, Backend: i.Backend, State: i.State, Suspend: i.Suspend, Err: i.Error}
	var err error
	r.Live, err = g.live(ctx, e, i, now, cpu)
	if err != nil {
		r.Err = err.Error()
	}
	return r
}

// Live reads what the VM of e, whose status is i, is doing now: a
// Gatherer's first reading, without the processor use (`list --json`).
func (g *Gatherer) Live(ctx context.Context, e state.Entry, i vminfo.Info) (Live, error) {
	return g.live(ctx, e, i, time.Now(), map[int]sample{})
}

func (g *Gatherer) live(ctx context.Context, e state.Entry, i vminfo.Info, now time.Time, cpu map[int]sample) (Live, error) {
	r := Live{CPU: -1, PSS: -1}
	if e.Record == nil {
		return r, nil
	}
	if i.Pid > 0 {
		if used, err := proc.CPUTime(i.Pid); err == nil {
			cpu[i.Pid] = sample{now, used}
			if prev, ok := g.cpu[i.Pid]; ok && now.After(prev.at) {
				r.CPU = 100 * float64(used-prev.used) / float64(now.Sub(prev.at))
			}
		}
		if pss, err := proc.PSS(i.Pid); err == nil {
			r.PSS = pss
		}
	}
	r.Conns, r.Refused = egressLastMinute(ctx, g.VMs, e, now)
	if i.Host == "" {
		r.Asks, _ = egress.ReadAsks(netpolicy.DirOf(e.Layout))
	}
	if i.State == vminfo.StateRunning && i.Foreign == "" {
		return r, g.sessions(ctx, guestconn.Guest{Record: e.Record, Layout: e.Layout, Log: hclog.NewNullLogger()}, &r)
	}
	return r, nil
}

// sessions reads the running VM's sessions and the screen of the one
// whose agent is the most pressing. The guest is reached from its record
// (through its holder): a VM's name resolves within the repository a
// command runs in, and top shows every repository's.
func (g *Gatherer) sessions(ctx context.Context, guest guestconn.Guest, r *Live) error {
	c, err := guest.Dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	infos, err := guestconn.Sessions(ctx, c)
	if err != nil {
		return err
	}
	r.Sessions = infos
	first := -1
	for k, in := range infos {
		if first < 0 || urgency(in.State) > urgency(infos[first].State) {
			first = k
		}
	}
	if first < 0 {
		return nil
	}
	r.Agent = infos[first].State
	var out bytes.Buffer
	if _, err := sshx.Run(ctx, c, session.Screen(infos[first].Name), nil, &out, io.Discard); err == nil {
		r.Last = session.LastLine(out.String())
	}
	return nil
}

// urgency orders the states by how much they need the user.
func urgency(state string) int {
	return map[string]int{session.Exited: 1, agentstate.Working: 2, agentstate.Done: 3, agentstate.Waiting: 4}[state]
}

// egressLastMinute counts the VM's connections in the minute before now,
// and the refused ones.
func egressLastMinute(ctx context.Context, vms netpolicy.LogPuller, e state.Entry, now time.Time) (conns, refused int) {
	stop, err := vms.PullLog(ctx, e, false)
	if err != nil {
		return 0, 0
	}
	stop()
	es, _ := egress.ReadLog(netpolicy.LogPath(e.Layout))
	for _, x := range es {
		if now.Sub(x.Time) <= time.Minute {
			conns++
			if !x.Allowed {
				refused++
			}
		}
	}
	return conns, refused
}
