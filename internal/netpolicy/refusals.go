package netpolicy

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/state"
)

// When an install in a guest fails (npm's agent CLIs and
// chrome-devtools-mcp, apt's packages), what the guest's program says is
// its own view, a 403 from the proxy at best: the reason is in the VM's
// connection log, which WithRefusals adds to the failure, with the fix.

// LogPuller brings a VM's connection log here (VMs has it; vm's Manager
// too).
type LogPuller interface {
	// PullLog makes LogPath(e.Layout) hold e's connection log (see VMs).
	PullLog(ctx context.Context, e state.Entry, follow bool) (stop func(), err error)
}

// Refusals are the connections e's egress proxy refused since since,
// from its connection log: the last of each destination and reason, in
// the order they came.
func Refusals(ctx context.Context, logs LogPuller, e state.Entry, since time.Time) ([]egress.LogEntry, error) {
	stop, err := logs.PullLog(ctx, e, false)
	if err != nil {
		return nil, err
	}
	stop()
	es, err := egress.ReadLog(LogPath(e.Layout))
	if err != nil {
		return nil, err
	}
	var out []egress.LogEntry
	seen := map[string]int{}
	for _, x := range es {
		if x.Allowed || x.Kind == egress.KindOpenURL || x.Kind == egress.KindDevTools || x.Time.Before(since) {
			continue
		}
		key := fmt.Sprintf("%s:%d %s %v", x.Host, x.Port, x.Rule, x.Refused)
		if i, ok := seen[key]; ok {
			out[i] = x
			continue
		}
		seen[key] = len(out)
		out = append(out, x)
	}
	return out, nil
}

// RefusedError is a failed install in a guest, with what the VM's egress
// proxy refused meanwhile.
type RefusedError struct {
	Err error
	// Branch is the name the fixes give (`net allow BRANCH ...`).
	Branch   string
	Refusals []egress.LogEntry
}

func (e *RefusedError) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	b.WriteString("\nthe VM's egress proxy refused meanwhile:")
	for _, x := range e.Refusals {
		fmt.Fprintf(&b, "\n  - %s (hint: %s)", Reason(x), egress.Fix(x, e.Branch))
	}
	return b.String()
}

func (e *RefusedError) Unwrap() error { return e.Err }

// Reason says in one line why the proxy refused x.
func Reason(x egress.LogEntry) string {
	if x.Rule == egress.RuleAddresses {
		return fmt.Sprintf("%s:%d: the name is allowed, but %s", x.Host, x.Port, egress.RefusedAddrs(x))
	}
	return fmt.Sprintf("%s:%d: denied by the rule %q", x.Host, x.Port, x.Rule)
}

// WithRefusals is err, an install in e's guest that began at since and
// failed, with the connections e's proxy refused since then: each
// destination, why, and the command that lifts it (branch names the VM
// in them). err comes back as it is when nothing was refused, or when the
// log cannot be read: that failure of its own would hide err.
func WithRefusals(ctx context.Context, logs LogPuller, e state.Entry, branch string, since time.Time, err error) error {
	if err == nil {
		return nil
	}
	rs, rerr := Refusals(ctx, logs, e, since)
	if rerr != nil || len(rs) == 0 {
		return err
	}
	return &RefusedError{Err: err, Branch: branch, Refusals: rs}
}
