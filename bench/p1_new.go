package main

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/bench/report"
)

// runP1New is P1': how long a new branch waits for its VM,
// `create` + `start` to SSH-ready, against the same guest's first boot by
// QEMU alone. It reads P1's rounds when P1 ran in this run (each began
// with a new branch); else it makes its own, as P1's first half.
func runP1New(ctx context.Context, l *lab, f *report.Figure) error {
	if len(l.newBranches) > 0 {
		f.Notes = append(f.Notes, "Measured in P1's rounds (their first boots): each began with `create` of a new branch.")
	} else {
		if err := l.stopAll(ctx); err != nil {
			return err
		}
		for r := 1; r <= l.cfg.Rounds; r++ {
			if _, _, err := newBranchRound(ctx, l, f, "p1n", r); err != nil {
				return err
			}
		}
	}
	var ssh, health, bare []float64
	paths := map[string]bool{}
	for _, nb := range l.newBranches {
		ssh = append(ssh, nb.create+nb.start.SSHWall)
		health = append(health, nb.create+nb.start.Wall)
		bare = append(bare, nb.bare)
		paths[bootPath(nb.start.Said)] = true
		f.Notes = append(f.Notes, fmt.Sprintf("%s: create %.1f s; start said: %q", nb.vm.name, nb.create, nb.start.Said))
	}
	path := strings.Join(slices.Sorted(maps.Keys(paths)), " or ")
	bareRef := report.Ref("bare QEMU, first boot of the same guest, to SSH-ready", bare)
	f.Rows = []*report.Row{
		report.NewRow("P1'.ssh", "new branch: `create` + `start` -> SSH-ready ("+path+")", "s",
			report.NewSeries("agent-vm create + start", ssh), bareRef, true),
		report.NewRow("P1'.health", "new branch: `create` + `start` -> agent-mcp healthy ("+path+")", "s",
			report.NewSeries("agent-vm create + start", health), bareRef, true),
	}
	f.Rows[0].Note = "goal: 5 s or less"
	rows, err := p1FromTemplate(ctx, l, f, bareRef)
	f.Rows = append(f.Rows, rows...)
	f.Notes = append(f.Notes,
		"Subject: `create` (clone, record, keys) plus `start` up to agent-vm seeing SSH answer (its \"ssh ready\" debug log), or up to start's exit (agent-mcp healthy). The path start took is read from its summary line; a start that names no other path is a cold first boot with cloud-init.",
		"The reference is P1's: the guest booted by QEMU alone on its own overlay with a copy of the VM's seed (cloud-init provisions it the same way).")
	return err
}

// p1FromTemplate is P1' as its goal means it: `agent-vm template
// build` once (not timed: a build is a cold boot, done once per machine
// shape), then, per round, a new branch's `create` + `start`, which
// restores the template and personalizes the clone. The reference is the
// same bare first boot as the cold rows' (not paired: other VMs, other
// moments). The template is removed at the
// lab's cleanup.
func p1FromTemplate(ctx context.Context, l *lab, f *report.Figure, bareRef *report.Series) ([]*report.Row, error) {
	if len(l.newBranches) == 0 {
		return nil, nil
	}
	if err := l.stopAll(ctx); err != nil {
		return nil, err
	}
	// With agent CLIs (template build's default, once it has --agents)
	// a build is an npm install too: P1' is about the machine, P9 about
	// an agent.
	var flags []string
	if agents, err := templateAgents(ctx, l.av); err != nil {
		return nil, err
	} else if agents {
		flags = []string{"--agents", "none"}
	}
	if err := l.buildTemplate(ctx, f, bootTimeout, l.newBranches[0].vm.name, flags...); err != nil {
		return nil, err
	}
	var ssh, health []float64
	for r := 1; r <= l.cfg.Rounds; r++ {
		v, err := l.newVM(ctx, "p1t")
		if err != nil {
			return nil, err
		}
		l.log.Printf("%s round %d/%d: agent-vm start %s (from the template)", f.ID, r, l.cfg.Rounds, v.name)
		t, err := l.start(ctx, v, nil)
		if err != nil {
			return nil, err
		}
		if bootPath(t.Said) == "from the saved template" {
			ssh = append(ssh, v.create+t.SSHWall)
			health = append(health, v.create+t.Wall)
			f.Notes = append(f.Notes, fmt.Sprintf("%s: create %.1f s; start said: %q", v.name, v.create, t.Said))
		} else {
			f.Errors = append(f.Errors, fmt.Sprintf("%s booted cold although a template fits it: %q", v.name, t.Said))
		}
		if err := l.stop(ctx, v); err != nil {
			return nil, err
		}
	}
	rows := []*report.Row{
		report.NewRow("P1'T.ssh", "new branch: `create` + `start` -> SSH-ready (from the saved template)", "s",
			report.NewSeries("agent-vm create + start", ssh), bareRef, false),
		report.NewRow("P1'T.health", "new branch: `create` + `start` -> agent-mcp healthy (from the saved template)", "s",
			report.NewSeries("agent-vm create + start", health), bareRef, false),
	}
	rows[0].Note = "goal: 5 s or less"
	rows[1].Note = "goal: 6 s or less"
	return rows, nil
}

// buildTemplate runs `agent-vm template build FROM FLAGS...` (not timed:
// a build is a cold boot, done once per machine shape), keeps the
// template's name for the lab's cleanup, and notes the build in f.
func (l *lab) buildTemplate(ctx context.Context, f *report.Figure, timeout time.Duration, from string, flags ...string) error {
	l.log.Printf("%s: agent-vm template build %s (a cold boot, not timed)", f.ID, strings.Join(append([]string{from}, flags...), " "))
	res := l.av.run(ctx, timeout, append([]string{"template", "build", from}, flags...)...)
	if res.Err != nil {
		return res.Err
	}
	m := builtTemplate.FindStringSubmatch(res.Stdout)
	if m == nil {
		return fmt.Errorf("`%s` did not print its \"built template NAME in ...\" line; stdout: %q", res.Line, tail(res.Stdout, 3))
	}
	l.mu.Lock()
	l.templates = append(l.templates, m[1])
	l.mu.Unlock()
	with := ""
	if len(flags) > 0 {
		with = ", with " + shellJoin(flags)
	}
	f.Notes = append(f.Notes, fmt.Sprintf("Template built from %s's machine%s in %.0f s (not part of any row): %s", from, with, res.Seconds(), strings.TrimSpace(res.Stdout)))
	return nil
}

// builtTemplate is `template build`'s line on stdout.
var builtTemplate = regexp.MustCompile(`(?m)^built template (\S+) in `)

// bootPath is the path a start took, as its summary line names it.
func bootPath(said string) string {
	if strings.Contains(strings.ToLower(said), "template") {
		return "from the saved template"
	}
	return "cold first boot"
}
