package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// runP1New is issue 16's P1': how long a new branch waits for its VM,
// `create` + `start` to SSH-ready, against the same guest's first boot by
// QEMU alone. It reads P1's rounds when P1 ran in this run (each began
// with a new branch); else it makes its own, as P1's first half.
func runP1New(ctx context.Context, l *lab, f *Figure) error {
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
	bareRef := ref("bare QEMU, first boot of the same guest, to SSH-ready", bare)
	f.Rows = []*Row{
		newRow("P1'.ssh", "new branch: `create` + `start` -> SSH-ready ("+path+")", "s",
			series("agent-vm create + start", ssh), bareRef, true),
		newRow("P1'.health", "new branch: `create` + `start` -> agent-mcp healthy ("+path+")", "s",
			series("agent-vm create + start", health), bareRef, true),
	}
	f.Rows[0].Note = "issue 16's goal: 5 s or less"
	f.Notes = append(f.Notes,
		"Subject: `create` (clone, record, keys) plus `start` up to agent-vm seeing SSH answer (its \"ssh ready\" debug log), or up to start's exit (agent-mcp healthy). The path start took is read from its summary line; a start that names no other path is a cold first boot with cloud-init.",
		"The reference is P1's: the guest booted by QEMU alone on its own overlay with a copy of the VM's seed (cloud-init provisions it the same way).")
	return nil
}

// bootPath is the path a start took, as its summary line names it.
func bootPath(said string) string {
	if strings.Contains(strings.ToLower(said), "template") {
		return "from the saved template"
	}
	return "cold first boot"
}
