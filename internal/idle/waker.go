package idle

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/state"
)

// SuspendLog is the log of the commands Watch runs (suspend --hibernate,
// resume), in the VM's logs directory.
const SuspendLog = "idle.log"

// wakeOnConnection waits, while the VM is asleep, for a connection to its
// ports that is not among known, or bytes received on one that is, and
// then wakes it; the holder's own connections to the guest do not count
// (what it sent after the last note, such as the look at the sessions
// just before the hibernation, would wake the VM at once; agent-vm's
// commands that it relays resume the VM themselves). It returns the
// connections it saw last: after a wake that failed, only another new one
// tries again.
func (w *Watch) wakeOnConnection(ctx context.Context, known map[string]Conn) map[string]Conn {
	w.Log.Info("hibernated: a new connection to its ports wakes it", "ports", w.Ports(), "known", len(known))
	for w.Asleep() {
		now, err := Connections(w.Ports())
		if err != nil {
			w.Log.Warn("a connection to the hibernated VM will not wake it; `agent-vm resume` does", "error", err)
			break
		}
		_, own := w.Held()
		for k, c := range now {
			if holders(k, own) {
				continue // the holder's own requests (its look at the sessions, keepalives) are no client's
			}
			if old, ok := known[k]; !ok || c.Received > old.Received {
				w.Log.Info("a connection to the hibernated VM, or a request on one; waking it", "port", c.Port)
				if err := w.Wake(ctx); err != nil {
					w.Log.Warn("the VM did not wake", "error", err)
				}
				return now
			}
		}
		known = now // those that closed are forgotten
		select {
		case <-ctx.Done():
			return known
		case <-time.After(w.Tick / 2):
		}
	}
	// Looked at no more: the VM wakes when resumed by other means.
	for w.Asleep() && ctx.Err() == nil {
		time.Sleep(time.Second)
	}
	return known
}

// Ports are the host ports of r's VM: SSH, agent-mcp and its forwards.
func Ports(r *state.Record) []int {
	out := []int{r.Ports.SSH, r.Ports.MCP}
	for _, f := range r.Forwards {
		out = append(out, f.Host)
	}
	return out
}

// Args are the arguments of an agent-vm command (verb and its flags) for
// the VM of l: by its name, from outside any repository (the command runs
// in "/"), in the state directory that holds l.
func Args(l state.Layout, verb ...string) []string {
	return append(append([]string{"--state-dir", filepath.Dir(l.Dir)}, verb...), filepath.Base(l.Dir))
}

// holders says whether the connection keyed k (Connections: the listener's
// end, then the client's) is one of the holder's own, whose local ends are
// own.
func holders(k string, own []string) bool {
	_, client, _ := strings.Cut(k, " ")
	return slices.Contains(own, client)
}
