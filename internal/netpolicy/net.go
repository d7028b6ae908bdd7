package netpolicy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/state"
)

// VMs is what the net commands need of agent-vm's VMs; vm's Manager has
// it (cli wires it in).
type VMs interface {
	PinSource
	// Recorded finds the VM name means (a branch or a VM name), whose
	// record must be readable.
	Recorded(ctx context.Context, name string) (state.Entry, error)
	// Locked finds the VM name means, as Recorded, and takes its lock;
	// the caller releases it.
	Locked(ctx context.Context, name string) (state.Entry, *state.Lock, error)
	// State is the VM's state as status shows it (driver.StateRunning ...).
	State(ctx context.Context, e state.Entry) string
	// Contains reports whether the driver that runs r's VM contains its
	// network (a driver.NetworkContainer).
	Contains(r *state.Record) bool
	// Publish makes e's running proxy see its network directory's policy
	// as written here: nothing to do for a VM on this machine, whose proxy
	// reads it here; a VM placed on another host gets it copied there.
	Publish(ctx context.Context, e state.Entry) error
	// PullLog makes LogPath(e.Layout) hold e's connection log: nothing to
	// do for a VM on this machine; for a VM on another host, the log there
	// copied here, and with follow its growth appended until stop is
	// called.
	PullLog(ctx context.Context, e state.Entry, follow bool) (stop func(), err error)
	// WorkspacePath says where r's workspace lies; host is the registered
	// host the VM is placed on, "" for this machine.
	WorkspacePath(r *state.Record, l state.Layout) (path, host string)
}

func running(ctx context.Context, vms interface {
	State(ctx context.Context, e state.Entry) string
}, e state.Entry) bool {
	return vms.State(ctx, e) == driver.StateRunning
}

// Info is `net show`: the VM's mode, its effective allow-list,
// refusals and request rules, and its exposed ports.
type Info struct {
	Branch string   `json:"branch"`
	Mode   string   `json:"mode"`
	Allow  []string `json:"allow"`
	Added  []string `json:"added,omitempty"` // the user's own part of Allow
	// Repository is the repository's policy file as the VM was made with
	// it (its part of Allow, Deny and Requests); nil for none.
	Repository *state.RepoNet `json:"repository,omitempty"`
	Deny       []string       `json:"deny,omitempty"`
	// Requests are the request rules in force, in the order they are
	// tried: the user's, then the defaults.
	Requests []RequestRule   `json:"requests,omitempty"`
	Exposed  []state.Exposed `json:"exposed,omitempty"`
	Proxy    string          `json:"proxy"` // as the guest reaches it
	Log      string          `json:"log"`
	// Uncontained says why nothing enforces the policy: the guest is the
	// repository's own Vagrantfile's, on the networks it sets up. Then Mode,
	// Allow, Deny and Exposed are what the record says, unused.
	Uncontained string `json:"uncontained,omitempty"`
	// Browser says which browser bridges the running VM has open (agent-vm
	// browser): each a way to the host's browser, none by default.
	Browser []string `json:"browser,omitempty"`
	// Pins are the host's pins (`agent-vm setup`), every VM's: each lets
	// one address that is not globally reachable through for its name.
	Pins []egress.Pin `json:"pins,omitempty"`
	// AskWait is how long, in seconds, mode ask holds a connection for the
	// user's answer, and Pending how many it holds now (net pending).
	AskWait int `json:"ask_wait_s,omitempty"`
	Pending int `json:"pending,omitempty"`
	// Narrowed says, a line each, what the repository's policy file
	// narrows: where the user's secrets it names may go, which host MCP
	// servers mcp sync brings in.
	Narrowed []string `json:"narrowed,omitempty"`
}

// uncontained says why r's network is not contained, or "" when its
// driver contains it.
func uncontained(r *state.Record, contained bool) string {
	if contained {
		return ""
	}
	if r.Guest.Foreign != "" {
		return fmt.Sprintf("NOT contained: the guest is the repository's own Vagrantfile's (%s), on the networks that file and its provider set up (vagrant-libvirt's NAT bridge unless it says otherwise), so it reaches the host and, through NAT, everything the host reaches; no allow-list applies and no connection is logged (hint: create the VM with --vagrantfile=generate, agent-vm's own, for a contained network)", r.Guest.Foreign)
	}
	return fmt.Sprintf("NOT contained: the %s backend's driver in this agent-vm does not contain the guest's network; no allow-list applies and no connection is logged", r.Backend)
}

// refuseUncontained refuses a change of a policy nothing would enforce.
func refuseUncontained(vms VMs, r *state.Record, what string) error {
	if why := uncontained(r, vms.Contains(r)); why != "" {
		return fmt.Errorf("cannot %s for %q: its network is %s", what, r.Branch, why)
	}
	return nil
}

// Show reports a VM's egress policy (`net show`).
func Show(ctx context.Context, vms VMs, name string) (*Info, error) {
	e, err := vms.Recorded(ctx, name)
	if err != nil {
		return nil, err
	}
	pins, err := vms.Pins()
	if err != nil {
		return nil, err
	}
	return InfoOf(e, vms.Contains(e.Record), pins), nil
}

// InfoOf is the policy of e's VM, with the host's pins, as `net show` and
// status show it; contained: its driver contains its network.
func InfoOf(e state.Entry, contained bool, pins []egress.Pin) *Info {
	r := e.Record
	p := Policy(r, pins)
	info := &Info{Branch: r.Branch, Mode: p.Mode, Allow: p.Allow, Deny: p.Deny, Requests: requestInfo(r), Exposed: r.Exposed,
		Proxy: guest.ProxyURL, Log: LogPath(e.Layout), Pins: p.Pins}
	if r.Net != nil {
		info.Added, info.Repository = r.Net.Allow, r.Net.Repo
	}
	if rp := info.Repository; rp != nil {
		for _, name := range slices.Sorted(maps.Keys(rp.Secrets)) {
			info.Narrowed = append(info.Narrowed, fmt.Sprintf("secret %s: only to %s, of the hosts you bound it to", name, cmp.Or(strings.Join(rp.Secrets[name], ", "), "no host")))
		}
		if rp.MCP != nil {
			info.Narrowed = append(info.Narrowed, "mcp sync: only the host's MCP servers "+cmp.Or(strings.Join(*rp.MCP, ", "), "(none)"))
		}
	}
	info.Uncontained = uncontained(r, contained)
	if p.Mode == egress.ModeAsk {
		info.AskWait = int(p.AskTimeout().Seconds())
		asks, _ := egress.ReadAsks(DirOf(e.Layout)) // none while the proxy does not run
		info.Pending = len(asks)
	}
	if d, err := bridge.ReadConfig(e.Layout.RunDir()); err != nil {
		info.Browser = []string{"unknown: " + err.Error()}
	} else {
		info.Browser = d.Lines()
	}
	return info
}

// Change is `net allow|deny|mode`: the patterns given, as the policy now
// has them.
type Change struct {
	Info *Info
	// Live: the VM runs, and its proxy applies the change at once.
	Live bool
}

// Allow adds patterns to a VM's allow-list (and takes them off its
// refusals); Deny refuses them in every mode. A pattern with a space is a
// request rule, "METHOD host/path" (egress.ParseRequestPattern): it goes
// before the user's other rules, replacing one of the same pattern. Both
// apply at once to a running VM.
func Allow(ctx context.Context, vms VMs, name string, patterns []string) (*Change, error) {
	return edit(ctx, vms, name, patterns, true)
}

// Deny: see Allow.
func Deny(ctx context.Context, vms VMs, name string, patterns []string) (*Change, error) {
	return edit(ctx, vms, name, patterns, false)
}

// SetMode changes a VM's egress mode; wait, for mode ask only, is how
// long a connection is held for the user's answer (0: as it was).
func SetMode(ctx context.Context, vms VMs, name, mode string, wait time.Duration) (*Change, error) {
	if err := egress.CheckMode(mode); err != nil {
		return nil, err
	}
	var secs int
	if wait != 0 {
		var err error
		if mode != egress.ModeAsk {
			return nil, fmt.Errorf("--wait is how long mode ask holds a connection; mode %s holds none (hint: leave --wait out)", mode)
		}
		if secs, err = CheckAskWait(wait); err != nil {
			return nil, err
		}
	}
	if mode == egress.ModeAsk {
		e, err := vms.Recorded(ctx, name)
		if err != nil {
			return nil, err
		}
		if err := askable(vms, e); err != nil {
			return nil, err
		}
	}
	return update(ctx, vms, name, func(r *state.Record) {
		n := netOf(r)
		n.Mode = mode
		if secs != 0 {
			n.AskWait = secs
		}
	})
}

func netOf(r *state.Record) *state.Net {
	if r.Net == nil {
		r.Net = &state.Net{Mode: egress.ModeAllow}
	}
	return r.Net
}

func edit(ctx context.Context, vms VMs, name string, patterns []string, allow bool) (*Change, error) {
	if len(patterns) == 0 {
		return nil, fmt.Errorf("no DOMAIN given (hint: e.g. example.com, *.example.com, 203.0.113.7, or a request rule such as 'POST api.github.com/repos/o/r/pulls')")
	}
	var hosts []string
	var rules []egress.RequestRule
	for _, p := range patterns {
		if isRequestRule(p) {
			rule, err := egress.NewRequestRule(allow, p)
			if err != nil {
				return nil, err
			}
			rules = append(rules, rule)
			continue
		}
		c, err := egress.CheckPattern(p)
		if err != nil {
			return nil, err
		}
		hosts = append(hosts, c)
	}
	return update(ctx, vms, name, func(r *state.Record) {
		n := netOf(r)
		for _, h := range hosts {
			if allow {
				n.Deny = slices.DeleteFunc(n.Deny, func(d string) bool { return d == h })
				if !slices.Contains(n.Allow, h) && !slices.Contains(egress.DefaultAllow, h) {
					n.Allow = append(n.Allow, h)
				}
			} else {
				n.Allow = slices.DeleteFunc(n.Allow, func(a string) bool { return a == h })
				if !slices.Contains(n.Deny, h) {
					n.Deny = append(n.Deny, h)
				}
			}
		}
		addRequests(n, rules)
	})
}

// update changes the record's network under the VM's lock and rewrites
// the proxy's policy.
func update(ctx context.Context, vms VMs, name string, change func(*state.Record)) (*Change, error) {
	e, lock, err := vms.Locked(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	if err := refuseUncontained(vms, e.Record, "change the network policy"); err != nil {
		return nil, err
	}
	pins, err := vms.Pins()
	if err != nil {
		return nil, err
	}
	change(e.Record)
	if err := state.WriteRecord(e.Layout.Record(), e.Record); err != nil {
		return nil, err
	}
	if err := Write(e.Layout, e.Record, pins); err != nil {
		return nil, err
	}
	if running(ctx, vms, e) {
		if err := vms.Publish(ctx, e); err != nil {
			return nil, fmt.Errorf("the change is recorded, but the VM's proxy did not get it: %w (hint: restart the VM to apply it)", err)
		}
	}
	return &Change{Info: InfoOf(e, vms.Contains(e.Record), pins), Live: running(ctx, vms, e)}, nil
}

// Refresher is what Refresh needs of agent-vm's VMs; vm's Manager has it.
type Refresher interface {
	PinSource
	// TryLockVM takes the lock of the VM called slug unless another
	// process holds it (ok false); the caller releases it.
	TryLockVM(slug string) (lock *state.Lock, ok bool, err error)
	State(ctx context.Context, e state.Entry) string
	Contains(r *state.Record) bool
	Publish(ctx context.Context, e state.Entry) error
}

// Refresh writes the policy of each VM of es whose network is contained
// and has a policy file again, with the host's current pins, so that a
// proxy that runs gets them at once: `agent-vm setup` calls it when the
// pins change. A running VM's policy is also published (a VM placed on
// another host gets it there); a VM paused in place here has its proxy
// read the file too. A VM that was never started has no policy yet and
// gets the pins at its first start, as a stopped VM of another state
// directory does at its next. It returns the running VMs it refreshed;
// one it could not (busy: a command holds its lock) is an error with the
// fix, and the others are still done.
func Refresh(ctx context.Context, vms Refresher, es []state.Entry) ([]string, error) {
	pins, err := vms.Pins()
	if err != nil {
		return nil, err
	}
	var done []string
	var errs []error
	for _, e := range es {
		if e.Record == nil || !vms.Contains(e.Record) {
			continue
		}
		if _, err := os.Stat(filepath.Join(DirOf(e.Layout), egress.PolicyFile)); err != nil {
			continue
		}
		up, err := refresh(ctx, vms, e, pins)
		if err != nil {
			errs = append(errs, fmt.Errorf("VM %s's proxy did not get the pins: %w (hint: `agent-vm restart %s` applies them)", e.Slug, err, e.Slug))
			continue
		}
		if up {
			done = append(done, e.Slug)
		}
	}
	return done, errors.Join(errs...)
}

// refresh writes e's policy with pins under its lock, from its record as
// it is then, and publishes it when the VM runs (up).
func refresh(ctx context.Context, vms Refresher, e state.Entry, pins []egress.Pin) (up bool, err error) {
	lock, ok, err := vms.TryLockVM(e.Slug)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, errors.New("another agent-vm command holds it")
	}
	defer lock.Release()
	r, err := state.ReadRecord(e.Layout.Record())
	if err != nil {
		return false, err
	}
	e.Record = r
	if err := Write(e.Layout, r, pins); err != nil {
		return false, err
	}
	if !running(ctx, vms, e) {
		return false, nil
	}
	return true, vms.Publish(ctx, e)
}

// Log returns a VM's connection log, oldest first, and where it is.
func Log(ctx context.Context, vms VMs, name string) ([]egress.LogEntry, string, error) {
	e, err := vms.Recorded(ctx, name)
	if err != nil {
		return nil, "", err
	}
	path := LogPath(e.Layout)
	stop, err := vms.PullLog(ctx, e, false)
	if err != nil {
		return nil, path, err
	}
	stop()
	es, err := egress.ReadLog(path)
	return es, path, err
}

// Follow calls emit with each connection name's VM logs after the log's
// current end until ctx ends.
func Follow(ctx context.Context, vms VMs, name string, emit func(egress.LogEntry) error) error {
	e, err := vms.Recorded(ctx, name)
	if err != nil {
		return err
	}
	path := LogPath(e.Layout)
	var off int64
	if fi, err := os.Stat(path); err == nil {
		off = fi.Size()
	}
	stop, err := vms.PullLog(ctx, e, true)
	if err != nil {
		return err
	}
	defer stop()
	return egress.Follow(ctx, path, off, emit)
}
