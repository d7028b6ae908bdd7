package hostsetup

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/pins"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Sources are the names setup pins and doctor's egress check resolves:
// egress.PackageSources, and the hosts of the apt mirrors the default base
// image was built with (`image build --mirror`), which the guests' apt
// uses.
func Sources(imageDir string) []string {
	names := slices.Clone(egress.PackageSources)
	img, err := image.Lookup(imageDir, image.DefaultBuildName)
	if err != nil {
		return names
	}
	for _, m := range []string{img.Manifest.Mirror, img.Manifest.SecurityMirror} {
		if u, err := url.Parse(m); err == nil && u.Hostname() != "" {
			if h, err := egress.CheckPattern(u.Hostname()); err == nil && !slices.Contains(names, h) {
				names = append(names, h)
			}
		}
	}
	return names
}

// PinOptions say what setup's pins step does.
type PinOptions struct {
	File     *pins.File
	ImageDir string // where the default base image's mirrors are read (Sources)
	// Lookup resolves names as the egress proxies will (nil:
	// net.DefaultResolver); Own lists the host's own addresses (nil:
	// egress.HostAddrs).
	Lookup pins.Lookup
	Own    func() ([]netip.Addr, error)
	// Record writes the pins; without it (`setup --no-pins`) the step
	// only says what it found, and the pins recorded before stay.
	Record bool
}

// PinReport is what setup's pins step found and did.
type PinReport struct {
	File     string `json:"file"`
	Recorded bool   `json:"recorded"`
	// Changes are each refused answer's pin (added, unchanged, or one of
	// the host's own addresses, never pinned) and the earlier pins kept
	// or dropped: what was done, or with Recorded false what would be.
	Changes []pins.Change `json:"changes"`
	// Pins are the pins in force now.
	Pins []egress.Pin `json:"pins"`
}

// Changed reports whether the pins in force changed.
func (r PinReport) Changed() bool { return r.Recorded && pins.Changed(r.Changes) }

// Pin is setup's pins step: it resolves the package sources (Sources) as
// the VMs' egress proxies will, and records a pin (internal/pins) for each
// answer the proxies refuse as not globally reachable, so that every VM
// reaches that name there; it never pins one of this host's own
// addresses. Run again, it pins anew what changed and drops what no longer
// resolves so. Without o.Record it changes nothing.
func Pin(ctx context.Context, o PinOptions) (PinReport, error) {
	r := PinReport{File: o.File.Path()}
	old, err := o.File.Read()
	if err != nil {
		return r, err
	}
	r.Pins = old
	answers, err := resolveSources(ctx, Sources(o.ImageDir), o.Lookup, o.Own)
	if err != nil {
		return r, err
	}
	now, changes := pins.Update(old, answers)
	r.Changes = changes
	if !o.Record {
		return r, nil
	}
	if pins.Changed(changes) {
		if err := o.File.Write(now); err != nil {
			return r, fmt.Errorf("recording the pins: %w", err)
		}
	}
	r.Recorded, r.Pins = true, now
	return r, nil
}

// resolveSources resolves names with lookup and judges the answers with
// the host's own addresses (nil lookup, own: the host's).
func resolveSources(ctx context.Context, names []string, lookup pins.Lookup, own func() ([]netip.Addr, error)) ([]pins.Answer, error) {
	if lookup == nil {
		lookup = net.DefaultResolver.LookupNetIP
	}
	if own == nil {
		own = egress.HostAddrs
	}
	addrs, err := own()
	if err != nil {
		return nil, err
	}
	return pins.Resolve(ctx, names, lookup, addrs), nil
}

// egressCheck is doctor's egress line: the package sources' answers
// (resolveSources) against the pins. An answer the proxies refuse and no
// pin lets through leaves every VM without packages; a host that resolves
// none of them is offline, which is no finding of this check.
func egressCheck(answers []pins.Answer, pinned []egress.Pin, err error) Check {
	c := Check{Name: "egress"}
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	missing := pins.Unpinned(pinned, answers)
	var names []string
	for _, a := range answers {
		names = append(names, a.Name)
	}
	if len(missing) == 0 {
		c.OK = true
		c.Detail = "the guests' package sources (" + strings.Join(names, ", ") + ") resolve to addresses the egress proxy reaches"
		if len(pinned) > 0 {
			c.Detail += fmt.Sprintf(", %d of them through the pins below", len(pinned))
		}
		return c
	}
	var found []string
	own := false
	for _, m := range missing {
		found = append(found, fmt.Sprintf("%s resolves to %s here, %s", m.Pin.Name, m.Pin.Addr, m.Why))
		own = own || m.Kind == pins.Refused
	}
	c.Detail = strings.Join(found, "; ") + ": every VM's egress proxy refuses such an address, even for an allowed name"
	c.Hint = "if it is your network's gateway or mirror, `agent-vm setup` pins it for every VM (for that name alone); for one VM, `agent-vm net allow --vm BRANCH ADDRESS` (before its first boot when that installs packages)"
	if own {
		c.Hint += "; an address of this host is never pinned: `agent-vm net allow --vm BRANCH ADDRESS` lets that VM reach this host there"
	}
	return c
}

// Lines say what setup's pins step found and did, one line a pin, escaped
// for a terminal.
func (r PinReport) Lines() []string {
	var out []string
	say := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	unchanged := 0
	for _, c := range r.Changes {
		p, why := termsafe.String(c.Pin.String()), termsafe.String(c.Why)
		switch {
		case c.Kind == pins.Unchanged:
			unchanged++
		case c.Kind == pins.Added && r.Recorded:
			say("pinned: %s (%s: taken as this network's gateway or mirror; every VM's egress proxy now connects there for that name alone)", p, why)
		case c.Kind == pins.Added:
			say("found: %s (%s; not pinned: --no-pins)", p, why)
		case c.Kind == pins.Dropped && r.Recorded:
			say("unpinned: %s (%s)", p, why)
		case c.Kind == pins.Dropped:
			say("pinned still: %s, though %s (--no-pins)", p, why)
		case c.Kind == pins.Kept:
			say("kept: %s (%s)", p, why)
		case c.Kind == pins.Refused:
			say("not pinned: %s (%s; should %s's mirror be this host, `agent-vm net allow --vm BRANCH %s` lets one VM reach it there)",
				p, why, termsafe.String(c.Pin.Name), c.Pin.Addr)
		}
	}
	if unchanged > 0 {
		say("pinned already: %d (`agent-vm doctor` lists the pins)", unchanged)
	}
	if !r.Recorded && slices.ContainsFunc(r.Changes, func(c pins.Change) bool { return c.Kind == pins.Added || c.Kind == pins.Dropped }) {
		say("nothing recorded (--no-pins); the pins in force stay as they are (%s). Without a pin, a VM reaches such an address only with `agent-vm net allow --vm BRANCH ADDRESS`, and then under every name it may reach", r.File)
	}
	return out
}
