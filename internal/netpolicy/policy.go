// Package netpolicy is a VM's network policy as agent-vm keeps it: the record's
// egress mode, allow-list, refusals and request rules (with the defaults for a
// workspace whose upstream is on GitHub) and the host ports the guest may reach
// (its exposed ports), rendered as the policy file the VM's egress proxy reads
// (internal/egress), shown and changed by `agent-vm net` and `port expose`, and
// written again by whoever changes the record's exposed ports (`mcp sync`).
//
// It drives no VM itself: the commands find and lock a VM, and ask whether
// it runs and whether its driver contains its network, through VMs, the
// small interface of vm's Manager they need (cli wires it in).
package netpolicy

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Dir is a VM's network directory, in the VM directory: the policy the
// proxy reads, its connection log and mode ask's asks and answers
// (egress.PolicyFile, egress.LogFile, egress.AsksFile, egress.AnswersFile),
// each 0600 and, with the directory, the user the proxy runs as.
const Dir = state.NetDir

// DirOf is the network directory of the VM laid out as l.
func DirOf(l state.Layout) string { return l.NetDir() }

// LogPath is the VM's connection log.
func LogPath(l state.Layout) string { return filepath.Join(DirOf(l), egress.LogFile) }

// ModeOf is the record's mode, allow by default.
func ModeOf(r *state.Record) string {
	if r.Net == nil || r.Net.Mode == "" {
		return egress.ModeAllow
	}
	return r.Net.Mode
}

// Policy is the proxy's policy for r: the default allow-list, the repository's
// git remote host, the hosts of its secrets, the repository's policy file's
// allows and refusals (state.Net.Repo), the user's own additions and
// refusals (a user's allow lifts the file's refusal), the exposed ports, the
// request rules (the user's, then the file's, then the defaults:
// defaultRequests) and the host's pins (internal/pins), which are every VM's.
func Policy(r *state.Record, pins []egress.Pin) egress.Policy {
	p := egress.Policy{Branch: r.Slug, Mode: ModeOf(r), Allow: slices.Clone(egress.DefaultAllow), Pins: slices.Clone(pins)}
	for _, u := range []string{r.Git.UpstreamURL, r.Git.OriginURL} {
		if h := remoteHost(u); h != "" && !slices.Contains(p.Allow, h) {
			p.Allow = append(p.Allow, h)
		}
	}
	for _, h := range r.SecretHosts {
		if !slices.Contains(p.Allow, h) {
			p.Allow = append(p.Allow, h)
		}
	}
	if r.Net != nil {
		if rp := r.Net.Repo; rp != nil {
			for _, a := range rp.Allow {
				if !slices.Contains(p.Allow, a) {
					p.Allow = append(p.Allow, a)
				}
			}
		}
		for _, a := range r.Net.Allow {
			if !slices.Contains(p.Allow, a) {
				p.Allow = append(p.Allow, a)
			}
		}
		p.Deny, p.AskWait = slices.Clone(r.Net.Deny), r.Net.AskWait
		// The repository's refusals, but those the user allowed since.
		if rp := r.Net.Repo; rp != nil {
			for _, d := range rp.Deny {
				if !slices.Contains(r.Net.Allow, d) && !slices.Contains(p.Deny, d) {
					p.Deny = append(p.Deny, d)
				}
			}
		}
	}
	for _, x := range r.Exposed {
		if !slices.Contains(p.Exposed, x.Port) {
			p.Exposed = append(p.Exposed, x.Port)
		}
	}
	slices.Sort(p.Exposed)
	p.Requests = append(append(userRequests(r), repoRequests(r)...), defaultRequests(r)...)
	return p
}

// remoteHost is the host of a git remote URL (https://host/..., ssh://,
// scp-like user@host:path); "" for local paths.
func remoteHost(u string) string {
	if u == "" || strings.HasPrefix(u, "/") || strings.HasPrefix(u, "file:") {
		return ""
	}
	if pu, err := url.Parse(u); err == nil && pu.Host != "" {
		h, err := egress.CheckPattern(pu.Hostname())
		if err != nil {
			return ""
		}
		return h
	}
	if at := strings.Index(u, "@"); at >= 0 {
		if host, _, ok := strings.Cut(u[at+1:], ":"); ok {
			if h, err := egress.CheckPattern(host); err == nil {
				return h
			}
		}
	}
	return ""
}

// Write renders r's policy, with the host's pins, for the proxy of the VM
// laid out as l, which re-reads it at once.
func Write(l state.Layout, r *state.Record, pins []egress.Pin) error {
	if err := os.Mkdir(DirOf(l), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return egress.WritePolicy(DirOf(l), Policy(r, pins))
}

// PinSource gives the host's pins (internal/pins: `agent-vm setup` records
// them), which every VM's policy carries; vm's Manager has it.
type PinSource interface {
	Pins() ([]egress.Pin, error)
}
