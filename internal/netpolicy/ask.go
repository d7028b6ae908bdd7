package netpolicy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Pending is `net pending`: the connections a VM's proxy holds while the
// user is asked (mode ask), oldest first.
type Pending struct {
	Branch string       `json:"branch"`
	Mode   string       `json:"mode"`
	Asks   []egress.Ask `json:"asks"`
}

// Asks lists the asks pending for the VM name means: none when it does not
// run (its proxy's asks ended with it).
func Asks(ctx context.Context, vms VMs, name string) (*Pending, error) {
	e, err := vms.Recorded(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := askable(vms, e); err != nil {
		return nil, err
	}
	p := &Pending{Branch: e.Record.Branch, Mode: ModeOf(e.Record), Asks: []egress.Ask{}}
	if !running(ctx, vms, e) {
		return p, nil
	}
	asks, err := egress.ReadAsks(DirOf(e.Layout))
	if err != nil {
		return nil, fmt.Errorf("reading VM %s's pending asks: %w", e.Slug, err)
	}
	if asks != nil {
		p.Asks = asks
	}
	return p, nil
}

// askable refuses what mode ask cannot do: a VM whose network nothing
// contains, and a VM placed on another host, whose proxy asks there.
func askable(vms VMs, e state.Entry) error {
	if err := refuseUncontained(vms, e.Record, "ask about its connections"); err != nil {
		return err
	}
	if _, host := vms.WorkspacePath(e.Record, e.Layout); host != "" {
		return fmt.Errorf("VM %s runs on host %s, whose proxy would hold its connections: mode ask is for VMs on this machine (hint: `agent-vm net allow --vm %s DOMAIN` lets a name through)", e.Record.Branch, host, e.Record.Branch)
	}
	return nil
}

// Answered is `net approve|deny ID...`: the asks answered, and with Always
// the policy as it now is.
type Answered struct {
	Branch string       `json:"branch"`
	Allow  bool         `json:"allow"`
	Always bool         `json:"always"`
	Asks   []egress.Ask `json:"asks"`
	Change *Change      `json:"change,omitempty"`
}

// Answer answers the asks ids of the VM name means: lets their connections
// through (allow) or refuses them. An answer is the same for every ask
// pending for the same name: they are one question. With always, the names
// are also added to the VM's allow-list or refusals, as `net allow|deny`
// does, after the answer is written (so the log says the user answered).
func Answer(ctx context.Context, vms VMs, name string, ids []int, allow, always bool) (*Answered, error) {
	if len(ids) == 0 {
		return nil, fmt.Errorf("no ask ID given (hint: `agent-vm net pending` lists them)")
	}
	e, lock, err := vms.Locked(ctx, name)
	if err != nil {
		return nil, err
	}
	answered, err := answer(ctx, vms, e, ids, allow, always)
	lock.Release()
	if err != nil || !always {
		return answered, err
	}
	var hosts []string
	for _, a := range answered.Asks {
		if !slices.Contains(hosts, a.Host) {
			hosts = append(hosts, a.Host)
		}
	}
	if answered.Change, err = edit(ctx, vms, name, hosts, allow); err != nil {
		list := "refusals"
		if allow {
			list = "allow-list"
		}
		return nil, fmt.Errorf("the asks are answered, but %s did not join the VM's %s: %w", strings.Join(hosts, " "), list, err)
	}
	return answered, nil
}

// answer writes the answers under the VM's lock.
func answer(ctx context.Context, vms VMs, e state.Entry, ids []int, allow, always bool) (*Answered, error) {
	if err := askable(vms, e); err != nil {
		return nil, err
	}
	if !running(ctx, vms, e) {
		return nil, fmt.Errorf("VM %s does not run, so no ask is pending (hint: `agent-vm net pending %s` lists them while it runs)", e.Record.Branch, e.Record.Branch)
	}
	dir := DirOf(e.Layout)
	asks, err := egress.ReadAsks(dir)
	if err != nil {
		return nil, err
	}
	var hosts []string
	for _, id := range ids {
		i := slices.IndexFunc(asks, func(a egress.Ask) bool { return a.ID == id })
		if i < 0 {
			return nil, fmt.Errorf("no ask %d is pending for VM %s (hint: `agent-vm net pending %s` lists them; an ask unanswered for its wait was refused)", id, e.Record.Branch, e.Record.Branch)
		}
		hosts = append(hosts, asks[i].Host)
	}
	old, err := egress.ReadAnswers(dir)
	if err != nil {
		return nil, err
	}
	pending := func(tok string) bool {
		return slices.ContainsFunc(asks, func(a egress.Ask) bool { return a.Token == tok })
	}
	answers := slices.DeleteFunc(old, func(a egress.Answer) bool { return !pending(a.Token) })
	out := &Answered{Branch: e.Record.Branch, Allow: allow, Always: always}
	for _, a := range asks {
		if slices.Contains(hosts, a.Host) {
			answers = append(answers, egress.Answer{ID: a.ID, Token: a.Token, Allow: allow, Always: always})
			out.Asks = append(out.Asks, a)
		}
	}
	if err := egress.WriteAnswers(dir, answers); err != nil {
		return nil, fmt.Errorf("writing the answers for VM %s's proxy: %w", e.Slug, err)
	}
	return out, nil
}

// CheckAskWait checks `net mode ask --wait`: whole seconds, from one to
// egress.MaxAskWait.
func CheckAskWait(d time.Duration) (int, error) {
	if d < time.Second || d > egress.MaxAskWait*time.Second || d%time.Second != 0 {
		return 0, fmt.Errorf("--wait %s is not whole seconds from 1s to %ds (hint: e.g. --wait 2m)", d, egress.MaxAskWait)
	}
	return int(d / time.Second), nil
}
