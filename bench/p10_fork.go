package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/bench/report"
)

// P10 and P11 are what a user waits for when they copy a working VM:
// `fork` into a new branch and the fork's first start (P10), and a
// `checkpoint` of the running VM, then `rollback` to it and the start after
// (P11). agent-vm's forks and checkpoints are cold (the workspace and disk,
// not the memory: docs/design.md, "Fork"), so the fork and the rolled-back
// VM boot; the goals beside them are for copies that carry the memory.

// runP10 forks the running, settled VM into a new branch per round, starts
// the fork and destroys it again.
func runP10(ctx context.Context, l *lab, f *report.Figure) error {
	v, err := l.running(ctx)
	if err != nil {
		return err
	}
	var pause, call, ssh, ready, pss, srcPSS []float64
	for r := 1; r <= l.cfg.Rounds; r++ {
		branch := fmt.Sprintf("%s-fork-%d", v.name, r)
		l.log.Printf("P10 round %d/%d: fork %s into %s", r, l.cfg.Rounds, v.name, branch)
		p, c, err := l.pausedCopy(ctx, "fork", "--vm", v.name, "--json", branch)
		if err != nil {
			return err
		}
		pause, call = append(pause, p), append(call, c)
		t, err := l.av.start(ctx, branch, nil)
		if err != nil {
			return err
		}
		ssh, ready = append(ssh, t.SSHWall), append(ready, t.Wall)
		if err := l.settle(ctx, &labVM{name: branch}); err != nil {
			return err
		}
		pss, srcPSS = append(pss, l.pssMiB(ctx, branch)), append(srcPSS, l.pssMiB(ctx, v.name))
		if res := l.av.run(ctx, stopTimeout, "destroy", "--force", branch); res.Err != nil {
			return res.Err
		}
	}
	p := report.NewRow("P10.pause", "the running source paused for the copy (its workspace and disk)", "s", report.NewSeries("fork's pause", pause), report.Ref("`agent-vm fork` until it returns", call), true)
	p.Note = "goal: 2 s or less"
	s := report.NewRow("P10.ssh", "the fork's first start -> SSH-ready (a cold boot of the copied disk, given the fork's identity over SSH)", "s", report.NewSeries("agent-vm start FORK", ssh), report.Ref("the same start until agent-mcp is healthy", ready), true)
	s.Note = "goal (a fork that continues the source's memory): 5 s; not met: forks boot cold"
	m := report.NewRow("P10.pss", "the fork's QEMU, settled: PSS (shared pages divided among their users)", "MiB", report.NewSeries("fork", pss), report.Ref("the source's QEMU, measured right after", srcPSS), true)
	m.Note = "QEMU's TCG translation cache is part of both: /proc gives it no line of its own"
	f.Rows = []*report.Row{p, s, m}
	f.Notes = append(f.Notes, "Per round: `fork --vm SRC NEW` of the running, settled VM (its guest syncs, it is paused, its workspace and disk are copied, it continues), `start NEW`, `systemctl is-system-running --wait` in the fork, the two QEMUs' PSS, `destroy --force NEW`.")
	return nil
}

// runP11 takes a checkpoint of the running, settled VM per round, stops
// it, rolls it back and starts it again.
func runP11(ctx context.Context, l *lab, f *report.Figure) error {
	v, err := l.running(ctx)
	if err != nil {
		return err
	}
	var cp, pause, rollback, back, stopped []float64
	for r := 1; r <= l.cfg.Rounds; r++ {
		name := "p11-" + strconv.Itoa(r)
		l.log.Printf("P11 round %d/%d: checkpoint %s of %s, stop, rollback, start", r, l.cfg.Rounds, name, v.name)
		p, c, err := l.pausedCopy(ctx, "checkpoint", "--vm", v.name, "--json", name)
		if err != nil {
			return err
		}
		cp, pause = append(cp, c), append(pause, p)
		if err := l.stop(ctx, v); err != nil {
			return err
		}
		res := l.av.run(ctx, quickTimeout, "rollback", "--vm", v.name, name)
		if res.Err != nil {
			return res.Err
		}
		rollback = append(rollback, res.Seconds())
		t, err := l.start(ctx, v, nil)
		if err != nil {
			return err
		}
		back, stopped = append(back, rollback[len(rollback)-1]+t.SSHWall), append(stopped, t.SSHWall)
		if err := l.settle(ctx, v); err != nil {
			return err
		}
		l.removeCheckpoints(ctx, v.name)
	}
	c := report.NewRow("P11.checkpoint", "`checkpoint` of the running VM, until it returns", "s", report.NewSeries("agent-vm checkpoint", cp), report.Ref("the VM's pause within it", pause), true)
	c.Note = "the pause's goal, as a fork's: 2 s or less"
	rb := report.NewRow("P11.rollback", "`rollback` of the stopped VM, then `start` to SSH-ready", "s", report.NewSeries("rollback + start -> SSH", back), report.Ref("the start alone", stopped), true)
	rb.Note = "goal (a rollback of the running VM with its memory): 5 s; not met: the VM boots its restored disk"
	f.Rows = []*report.Row{c, rb, report.NewRow("P11.files", "`rollback` alone: the workspace and disk put back, what they were kept as a checkpoint", "s", report.NewSeries("agent-vm rollback", rollback), nil, false)}
	f.Notes = append(f.Notes, "Per round: `checkpoint --vm VM NAME` of the running, settled VM, `stop`, `rollback --vm VM NAME`, `start`, `systemctl is-system-running --wait`, then the round's checkpoints removed.")
	return nil
}

// pausedCopy runs a copy of a VM (fork or checkpoint, args with --json)
// and returns how long the VM was paused for it (its paused_ms) and the
// whole call, in seconds.
func (l *lab) pausedCopy(ctx context.Context, args ...string) (pause, call float64, err error) {
	res := l.av.run(ctx, quickTimeout, args...)
	if res.Err != nil {
		return 0, 0, res.Err
	}
	var out struct {
		PausedMS float64 `json:"paused_ms"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil {
		return 0, 0, fmt.Errorf("reading `%s`: %w", res.Line, err)
	}
	return out.PausedMS / 1000, res.Seconds(), nil
}

// pssMiB is the PSS of the QEMU of VM name, in MiB (NaN when unreadable).
func (l *lab) pssMiB(ctx context.Context, name string) float64 {
	st, err := l.av.status(ctx, name)
	if err != nil || st.Pid == 0 {
		return math.NaN()
	}
	kb, err := strconv.Atoi(strings.TrimSuffix(procField("/proc/"+strconv.Itoa(st.Pid)+"/smaps_rollup", "Pss"), " kB"))
	if err != nil {
		return math.NaN()
	}
	return float64(kb) / 1024
}

// removeCheckpoints removes every checkpoint of vm.
func (l *lab) removeCheckpoints(ctx context.Context, vm string) {
	res := l.av.run(ctx, quickTimeout, "checkpoint", "list", "--json", vm)
	var cs []struct {
		Name string `json:"name"`
	}
	if res.Err != nil || json.Unmarshal([]byte(res.Stdout), &cs) != nil {
		return
	}
	for _, c := range cs {
		l.av.run(ctx, quickTimeout, "checkpoint", "rm", "--vm", vm, c.Name)
	}
}
