package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/agent-vm/agent-vm/bench/report"
)

// runP5 creates -records VM records in a state directory of their own,
// each create alternating with a `git clone` of the same repository (what
// create does at least), then times `list` there against `list` with a
// single record and against `agent-vm version`, in turn.
func runP5(ctx context.Context, l *lab, f *report.Figure) error {
	tiny := filepath.Join(l.dir, "tiny")
	if err := os.MkdirAll(tiny, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tiny, "README"), []byte("a small repository for P5\n"), 0o644); err != nil {
		return err
	}
	if err := initRepo(ctx, l.dir, tiny); err != nil {
		return err
	}
	many, one := l.stateDir("state-p5-many"), l.stateDir("state-p5-one")
	create := func(a *agentVM, name string) cmdResult {
		return a.run(ctx, quickTimeout, "create", "--repo", tiny, "--branch", name, "--backend", "qemu", "--cpus", vmCPUs, "--memory", vmMemory)
	}
	if res := create(one, "bench-p5-only"); res.Err != nil {
		return res.Err
	}
	l.log.Printf("P5: creating %d records", l.cfg.Records)
	var creates, clones []float64
	for i := 1; i <= l.cfg.Records; i++ {
		res := create(many, fmt.Sprintf("bench-p5-%03d", i))
		if res.Err != nil {
			return res.Err
		}
		creates = append(creates, res.Seconds()*1000)
		clone := runCmd(ctx, cmdSpec{Path: "git", Args: []string{"clone", "-q", "--no-hardlinks", tiny, filepath.Join(l.dir, "p5-clones", fmt.Sprint(i))}, Timeout: quickTimeout})
		if clone.Err != nil {
			clones = append(clones, math.NaN())
			f.Errors = append(f.Errors, clone.Err.Error())
			continue
		}
		clones = append(clones, clone.Seconds()*1000)
	}
	_ = os.RemoveAll(filepath.Join(l.dir, "p5-clones"))
	l.log.Printf("P5: timing list")
	out, err := interleave(l.cfg.N,
		func() cmdResult { return many.run(ctx, quickTimeout, "list") },
		func() cmdResult { return one.run(ctx, quickTimeout, "list") },
		func() cmdResult { return many.run(ctx, quickTimeout, "version") },
	)
	records := fmt.Sprintf("%d records", l.cfg.Records)
	f.Rows = []*report.Row{
		report.NewRow("P5.list", "`list` with "+records, "ms", report.NewSeries("agent-vm list", out[0]), report.Ref("`agent-vm list` with 1 record", out[1]), true),
		report.NewRow("P5.list-floor", "`list` with "+records, "ms", report.NewSeries("agent-vm list", out[0]), report.Ref("`agent-vm version`", out[2]), true),
		report.NewRow("P5.create", "`create` (clone, keys, token, ports) of a one-file repository", "ms", report.NewSeries("agent-vm create", creates), report.Ref("`git clone --no-hardlinks` of the same repository", clones), true),
	}
	f.Notes = append(f.Notes, "The records were never started, so `list` finds every VM stopped: it reads each record and checks for a QEMU pid. P5.list against 1 record is the cost of the extra records; against `version` it is list's whole cost over starting the binary.")
	return err
}
