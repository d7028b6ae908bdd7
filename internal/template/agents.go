package template

// A template's agent CLIs: `template build` installs them at its first
// boot (the template seed's npm install, through the template's egress
// proxy), then checks here that each is installed and runs before the
// machine is saved; template.json records the version each one is, so
// that its clones skip the install and `template list` can say when
// agent-vm pins a newer one.

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/sshx"
)

// AgentProbe is the root script that checks that the guest's first-boot
// setup has ended, then prints one line "NAME VERSION" per agent of pins: the
// version npm installed (its package.json) once NAME's program has run
// with --version as the guest's user. It stops at the first agent that is
// missing or does not run, saying which on stderr, with status 3.
func AgentProbe(pins []guest.AgentPin) string { return agentProbe(pins, guest.NPMGlobalRoot) }

// agentProbe is AgentProbe with npm's global packages in root. It reads
// package.json with Python (cloud-init's, so always there), not with npm
// or node: each Node.js start-up is seconds, and under TCG on a busy
// host minutes.
func agentProbe(pins []guest.AgentPin, root string) string {
	var b strings.Builder
	// start waited for the first boot's setup while it made progress; one
	// still running now made none for a long while.
	fmt.Fprintf(&b, "if cloud-init status 2>/dev/null | grep -q 'status: running'; then echo 'the first boot'\\''s setup has not finished; the end of its log:' >&2; tail -n 12 %s >&2; exit 3; fi\n", guest.FirstBootLog)
	fmt.Fprintf(&b, "root=%s\n", sshx.Quote([]string{root}))
	for _, p := range pins {
		installed := p.Installed(p.At, runtime.GOARCH) // the guest's CPU is this machine's
		name, pkg, cmd := sshx.Quote([]string{p.Name}), sshx.Quote([]string{installed}), sshx.Quote([]string{p.Command})
		fmt.Fprintf(&b, "v=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[\"version\"], end=\"\")' \"$root\"/%s/package.json 2>/dev/null) || { echo %s' is not installed; the end of the first boot'\\''s log:' >&2; tail -n 12 %s >&2; exit 3; }\n",
			pkg, name, guest.FirstBootLog)
		fmt.Fprintf(&b, "out=$(sudo -u %s -H -- %s --version 2>&1) || { echo %s' is installed but does not run: '\"$out\" >&2; exit 3; }\n",
			guest.User, cmd, name)
		fmt.Fprintf(&b, "echo %s \"$v\"\n", name)
	}
	return b.String()
}

// ParseAgentProbe reads AgentProbe's output for pins: each agent's
// installed version, by name.
func ParseAgentProbe(out string, pins []guest.AgentPin) (map[string]string, error) {
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if name, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && guest.IsExactVersion(v) {
			got[name] = v
		}
	}
	for _, p := range pins {
		v, ok := got[p.Name]
		switch {
		case !ok:
			return nil, fmt.Errorf("the guest did not say which version of %s it installed", p.Name)
		case p.At != "" && guest.IsExactVersion(p.At) && v != p.At:
			return nil, fmt.Errorf("%s %s was asked for, and npm installed %s", p.Name, p.At, v)
		}
	}
	if len(got) != len(pins) {
		return nil, fmt.Errorf("the guest named agents that were not asked for: %q", out)
	}
	return got, nil
}

// StaleAgents says which of a template's agents (name -> version) are
// older than the version agent-vm pins now, one phrase each (one built
// at a newer version on purpose, NAME@VERSION, is not).
func StaleAgents(agents map[string]string) []string {
	var out []string
	for _, a := range guest.Agents {
		if v, ok := agents[a.Name]; ok && older(v, a.Version) {
			out = append(out, fmt.Sprintf("%s %s is older than the %s agent-vm pins (its clones run %s)", a.Name, v, a.Version, v))
		}
	}
	return out
}

// older reports whether release a comes before release b (major, minor,
// patch; a pre-release before its release).
func older(a, b string) bool {
	pa, pb := releaseOf(a), releaseOf(b)
	for i := range pa {
		if pa[i] != pb[i] {
			return pa[i] < pb[i]
		}
	}
	return strings.ContainsAny(a, "-") && !strings.ContainsAny(b, "-") && a != b
}

func releaseOf(v string) [3]int {
	var r [3]int
	core, _, _ := strings.Cut(v, "-")
	core, _, _ = strings.Cut(core, "+")
	for i, f := range strings.SplitN(core, ".", 3) {
		r[i], _ = strconv.Atoi(f)
	}
	return r
}

// AgentsText is a template's agents as people read them, by name:
// "claude 2.1.332, codex 0.171.0" ("" for none).
func AgentsText(agents map[string]string) string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(agents)) {
		out = append(out, n+" "+agents[n])
	}
	return strings.Join(out, ", ")
}

// PinnedAgents are the agent CLIs agent-vm knows, each with the version
// it installs ("claude 2.1.332, ..."), for help texts.
func PinnedAgents() string {
	var pins []string
	for _, a := range guest.Agents {
		pins = append(pins, a.Name+" "+a.Version)
	}
	return strings.Join(pins, ", ")
}

// CheckAgents checks a list of agent CLIs for a build (see
// guest.ParseAgentPins), before anything is made.
func CheckAgents(list string) error {
	_, err := guest.ParseAgentPins(list)
	return err
}

// CurrentOf is the newest of ts that is ready, of the key whose prefix is
// prefix, not older than a build now would be (Info.Stale empty), and
// holds agents at the versions asked for: its slug, or "".
func CurrentOf(ts []Info, prefix string, agents []guest.AgentPin) string {
	for _, t := range slices.Backward(ts) { // newest last
		if !t.Ready || !strings.HasPrefix(t.Slug, prefix) || len(t.Stale) > 0 {
			continue
		}
		for _, a := range agents {
			if v, ok := t.Agents[a.Name]; !ok || (v != a.At && a.At == a.Version) {
				return ""
			}
		}
		return t.Slug
	}
	return ""
}
