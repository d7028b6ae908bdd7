// Package pins is the host's pins: for a package source (a name every VM
// needs, egress.PackageSources) that this host's resolver answers with an
// address the egress proxies refuse as not globally reachable (a gateway
// that answers every name with its own address, a corporate mirror, split
// DNS), the pair (name, address) that every VM's proxy then connects to,
// for that name alone (egress.Pin).
//
// We define the following terms:
//   - an answer: what this host's resolver says of one name, judged as the
//     proxy judges it (Resolve): the addresses it refuses, and why;
//   - a pin: a name and one of its refused addresses, recorded; never one
//     of the host's own addresses, which a pin would open to every VM;
//   - the pins file: the pins, one JSON file in agent-vm's configuration
//     directory (File), which `agent-vm setup` writes (Update) and every
//     start reads into the VM's policy.
package pins

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostdir"
)

// FileName is the pins file's name in agent-vm's configuration directory.
const FileName = "pins.json"

// fileVersion is the pins file's format.
const fileVersion = 1

// File is the host's pins file.
type File struct {
	// Dir is agent-vm's configuration directory (hostdir.Table.Config).
	Dir *hostdir.Dir
}

// content is the file: {"version": 1, "pins": [{"name": ..., "addr": ...}]},
// sorted by name, then address.
type content struct {
	Version int          `json:"version"`
	Pins    []egress.Pin `json:"pins"`
}

// Path is where the file is ("" for a nil File).
func (f *File) Path() string {
	if f == nil || f.Dir == nil {
		return ""
	}
	return filepath.Join(f.Dir.Path, FileName)
}

// Read returns the recorded pins: none when there is no file (or no File).
func (f *File) Read() ([]egress.Pin, error) {
	if f.Path() == "" {
		return nil, nil
	}
	b, err := os.ReadFile(f.Path())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the pins: %w", err)
	}
	var c content
	err = json.Unmarshal(b, &c)
	if err == nil && c.Version != fileVersion {
		err = fmt.Errorf("version %d, not %d", c.Version, fileVersion)
	}
	for _, p := range c.Pins {
		if err == nil && (p.Name == "" || !p.Addr.IsValid()) {
			err = fmt.Errorf("a pin without a name or an address: %+v", p)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the pins file %s is damaged: %w (hint: remove it and run `agent-vm setup` to pin the package sources again)", f.Path(), err)
	}
	return c.Pins, nil
}

// Write replaces the recorded pins (atomically, 0600: the user's alone,
// as the directory is; see hostdir.Table.Config). No pins removes the
// file.
func (f *File) Write(pins []egress.Pin) error {
	if f.Path() == "" {
		return errors.New("internal error: no configuration directory for the pins")
	}
	if len(pins) == 0 {
		if err := os.Remove(f.Path()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the pins: %w", err)
		}
		return nil
	}
	if err := f.Dir.Make(); err != nil {
		return err
	}
	pins = slices.Clone(pins)
	slices.SortFunc(pins, compare)
	return atomicfile.WriteJSON(f.Path(), content{Version: fileVersion, Pins: pins}, 0o600)
}

func compare(a, b egress.Pin) int {
	return cmp.Or(cmp.Compare(a.Name, b.Name), a.Addr.Compare(b.Addr))
}

// Lookup resolves a name as net.Resolver.LookupNetIP does.
type Lookup func(ctx context.Context, network, host string) ([]netip.Addr, error)

// Answer is what this host's resolver says of one name, as the egress
// proxy judges it.
type Answer struct {
	Name string
	// Addrs are all its addresses; Refused those the proxy refuses
	// (egress.Judge), in the resolver's order.
	Addrs   []netip.Addr
	Refused []egress.Refusal
	// Err: the name did not resolve (this host is offline, or the name
	// is unknown here); Addrs and Refused are empty.
	Err error
}

// lookupTimeout bounds each name's lookup.
const lookupTimeout = 5 * time.Second

// Resolve asks lookup for each name and judges each address as the
// egress proxy does, with own as the host's own addresses.
func Resolve(ctx context.Context, names []string, lookup Lookup, own []netip.Addr) []Answer {
	out := make([]Answer, 0, len(names))
	for _, n := range names {
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		addrs, err := lookup(lctx, "ip", n)
		cancel()
		a := Answer{Name: n, Err: err}
		if err == nil && len(addrs) == 0 {
			a.Err = errors.New("no address")
		}
		if a.Err == nil {
			for _, ad := range addrs {
				ad = ad.Unmap().WithZone("")
				if slices.Contains(a.Addrs, ad) {
					continue
				}
				a.Addrs = append(a.Addrs, ad)
				if r, refused := egress.Judge(ad, own); refused {
					a.Refused = append(a.Refused, r)
				}
			}
		}
		out = append(out, a)
	}
	return out
}

// Kind is what Update did with a pin.
type Kind string

// What Update does with a pin.
const (
	// Added: a new pin.
	Added Kind = "pinned"
	// Unchanged: recorded before, and the name still resolves to it.
	Unchanged Kind = "unchanged"
	// Kept: the name did not resolve now; its pin stays.
	Kept Kind = "kept"
	// Dropped: the name no longer resolves to it (or is no longer a
	// package source).
	Dropped Kind = "unpinned"
	// Refused: an answer that is never pinned, one of the host's own
	// addresses.
	Refused Kind = "not pinned"
)

// Change is one pin Update added, kept, left or dropped, or one answer
// it would not pin, and why.
type Change struct {
	Kind Kind       `json:"kind"`
	Pin  egress.Pin `json:"pin"`
	// Why: for Added and Unchanged, why the proxy would refuse the
	// address without the pin; for Refused, why it is never pinned; for
	// Kept and Dropped, what changed.
	Why string `json:"why"`
}

// Update is the pins after answers, given the pins recorded before
// (old): each refused answer that is not one of the host's own addresses
// is pinned; a name that did not resolve keeps its pins; every other old
// pin is dropped. The changes come in the answers' order, then the pins
// of names no longer asked about.
func Update(old []egress.Pin, answers []Answer) ([]egress.Pin, []Change) {
	var pins []egress.Pin
	var changes []Change
	asked := map[string]bool{}
	for _, a := range answers {
		asked[a.Name] = true
		if a.Err != nil {
			for _, p := range old {
				if p.Name == a.Name {
					pins = append(pins, p)
					changes = append(changes, Change{Kind: Kept, Pin: p, Why: fmt.Sprintf("%s did not resolve now: %v", a.Name, a.Err)})
				}
			}
			continue
		}
		for _, r := range a.Refused {
			p := egress.Pin{Name: a.Name, Addr: r.Addr}
			switch {
			case slices.Contains(pins, p):
				// given twice
			case r.Own:
				changes = append(changes, never(p, r))
			case slices.Contains(old, p):
				pins = append(pins, p)
				changes = append(changes, Change{Kind: Unchanged, Pin: p, Why: r.Why})
			default:
				pins = append(pins, p)
				changes = append(changes, Change{Kind: Added, Pin: p, Why: r.Why})
			}
		}
		for _, p := range old {
			if p.Name == a.Name && !slices.Contains(pins, p) {
				changes = append(changes, Change{Kind: Dropped, Pin: p, Why: droppedWhy(a, p)})
			}
		}
	}
	for _, p := range old {
		if !asked[p.Name] {
			changes = append(changes, Change{Kind: Dropped, Pin: p, Why: p.Name + " is not a package source agent-vm pins any more"})
		}
	}
	slices.SortFunc(pins, compare)
	return pins, changes
}

// never is the change of an answer that is one of the host's own
// addresses, r: p is not pinned, and why.
func never(p egress.Pin, r egress.Refusal) Change {
	return Change{Kind: Refused, Pin: p, Why: r.Why + ": a pin never lets a VM reach this host itself"}
}

// droppedWhy says why a's answer drops the old pin p.
func droppedWhy(a Answer, p egress.Pin) string {
	for _, r := range a.Refused {
		if r.Addr == p.Addr && r.Own {
			return fmt.Sprintf("%s is now an address of this host, which is never pinned", p.Addr)
		}
	}
	if len(a.Refused) == 0 {
		return fmt.Sprintf("%s now resolves to %s, which the egress proxy reaches", a.Name, addrList(a.Addrs))
	}
	return fmt.Sprintf("%s now resolves to %s", a.Name, addrList(a.Addrs))
}

func addrList(as []netip.Addr) string {
	ss := make([]string, 0, len(as))
	for _, a := range as {
		ss = append(ss, a.String())
	}
	return strings.Join(ss, ", ")
}

// Changed reports whether changes alter the recorded pins.
func Changed(changes []Change) bool {
	return slices.ContainsFunc(changes, func(c Change) bool { return c.Kind == Added || c.Kind == Dropped })
}

// Unpinned are the answers' refused addresses that no pin lets through,
// each as the change Update would make of it: Added (setup would pin it)
// or Refused (one of the host's own, never pinned). What doctor reports;
// names that did not resolve are not among them.
func Unpinned(pins []egress.Pin, answers []Answer) []Change {
	var out []Change
	for _, a := range answers {
		for _, r := range a.Refused {
			p := egress.Pin{Name: a.Name, Addr: r.Addr}
			switch {
			case r.Own: // refused by the proxy, pinned or not
				out = append(out, never(p, r))
			case !slices.Contains(pins, p):
				out = append(out, Change{Kind: Added, Pin: p, Why: r.Why})
			}
		}
	}
	return out
}
