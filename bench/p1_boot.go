package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"

	"github.com/agent-vm/agent-vm/bench/report"
)

// figureSpec is one figure the harness can measure.
type figureSpec struct {
	ID    string
	Title string
	Boots bool // needs VMs that boot
	Run   func(ctx context.Context, l *lab, f *report.Figure) error
}

// figureSpecs lists the figures in the order they run: those needing no VM
// first, on a quiet machine, then those sharing the lab's VMs.
func figureSpecs() []figureSpec {
	return []figureSpec{
		{ID: "P5", Title: "list with many records, and create", Run: runP5},
		{ID: "MCP", Title: "MCP proxy: added latency per request and 50 sessions", Run: runMCP},
		{ID: "P1", Title: "start to SSH-ready and health-ready, against a bare QEMU boot of the same guest", Boots: true, Run: runP1},
		{ID: "P1'", Title: "a new branch's VM: create + start to SSH-ready, against a bare QEMU first boot of the same guest", Boots: true, Run: runP1New},
		{ID: "P8", Title: "overlay size after the first boot, against the base image", Boots: true, Run: runP8},
		{ID: "P2", Title: "suspend and resume of a running VM, against a cold boot of the same VM", Boots: true, Run: runP2},
		{ID: "P3", Title: "exec round trip, against OpenSSH", Boots: true, Run: runP3},
		{ID: "P4", Title: "status --json", Run: runP4},
		{ID: "P6", Title: "workspace throughput (virtiofs, 9p) against the guest's own disk", Boots: true, Run: runP6},
		{ID: "P7", Title: "several VMs starting together", Boots: true, Run: runP7},
		{ID: "P10", Title: "fork of a running VM into a new branch, and the fork's first start (cold)", Boots: true, Run: runP10},
		{ID: "P11", Title: "checkpoint of a running VM, then rollback and the start after (cold)", Boots: true, Run: runP11},
		{ID: "P12", Title: "idle VMs hibernated: hibernate, wake by exec and by a request, and a fleet of 20 with 3 running", Boots: true, Run: runP12},
		{ID: "P9", Title: "a new branch's agent: `run --agent claude -- --version` with a template holding claude, against the same CLI run by exec in the same VM", Boots: true, Run: runP9},
	}
}

// p1Samples are one boot kind's samples, one per round.
type p1Samples struct {
	wall, sshWall, sshLaunch, bare []float64
}

func (s *p1Samples) add(t bootTimes, bare float64) {
	s.wall = append(s.wall, t.Wall)
	s.sshWall = append(s.sshWall, t.SSHWall)
	s.sshLaunch = append(s.sshLaunch, t.SSHLaunch)
	s.bare = append(s.bare, bare)
}

func (s *p1Samples) rows(kind string) []*report.Row {
	bare := "bare QEMU, " + kind + " boot, to SSH-ready"
	return []*report.Row{
		report.NewRow("P1."+kind+".ssh", "start -> SSH-ready, "+kind+" boot (from running `start`)", "s",
			report.NewSeries("agent-vm start", s.sshWall), report.Ref(bare, s.bare), true),
		report.NewRow("P1."+kind+".ssh-launch", "start -> SSH-ready, "+kind+" boot (start's own figure, from QEMU's launch)", "s",
			report.NewSeries("agent-vm start", s.sshLaunch), report.Ref(bare, s.bare), true),
		report.NewRow("P1."+kind+".health", "start -> agent-mcp healthy, "+kind+" boot (start returns)", "s",
			report.NewSeries("agent-vm start", s.wall), report.Ref(bare, s.bare), true),
	}
}

// runP1 boots, per round, a new VM with agent-vm and its guest bare, then
// both again: A(first) B(first) B(later) A(later). The bare boot needs the
// seed agent-vm writes at start, so A goes first; the later boots run in
// the opposite order, so drift over the round hits both alike. Each
// round's first boot is also a sample of P1' (l.newBranches).
func runP1(ctx context.Context, l *lab, f *report.Figure) error {
	if err := l.stopAll(ctx); err != nil {
		return err
	}
	var first, later p1Samples
	for r := 1; r <= l.cfg.Rounds; r++ {
		nb, b, err := newBranchRound(ctx, l, f, "p1", r)
		if err != nil {
			return err
		}
		b2, a2, err := p1Later(ctx, l, f, nb.vm, b, r)
		if err != nil {
			return err
		}
		first.add(nb.start, nb.bare)
		later.add(a2, b2)
		l.log.Printf("P1 round %d: first boot: agent-vm SSH %.1fs healthy %.1fs, bare SSH %.1fs; later boot: agent-vm SSH %.1fs healthy %.1fs, bare SSH %.1fs",
			r, nb.start.SSHWall, nb.start.Wall, nb.bare, a2.SSHWall, a2.Wall, b2)
		if r < l.cfg.Rounds {
			if err := l.stop(ctx, nb.vm); err != nil {
				return err
			}
		}
	}
	f.Rows = append(first.rows("first"), later.rows("later")...)
	f.Notes = append(f.Notes,
		"The reference is the guest agent-vm boots, booted by QEMU alone with the same command line minus virtiofsd, its shared memory, the fw_cfg token, QMP and the MCP forward, on its own overlay and a copy of the VM's seed ISO; ready = OpenSSH logs in with the VM's key against the pinned host key (polled every 0.25-1 s).",
		"First boot: cloud-init provisions the guest; later boot: the same overlay boots again (agent-vm switches cloud-init off after the first boot). The last VM is left running for the figures that follow.",
		"`ssh` rows count from running `start` (so they include preparing the seed and overlay); `ssh-launch` is start's own figure, from QEMU's launch; `health` is start's whole run (SSH, then agent-mcp's /health through the forwarded port). agent-vm polls SSH with a backoff of up to about 2 s, which is part of what it costs.")
	return nil
}

// newBranch is a new branch's VM made and booted for the first time
// (`create` + `start`), and its guest's first boot by QEMU alone.
type newBranch struct {
	vm     *labVM
	create float64 // seconds `create` took
	start  bootTimes
	bare   float64 // the bare first boot to SSH-ready; NaN if it failed
}

// newBranchRound creates a VM and starts it (A), stops it and boots its
// guest bare from a copy of its seed (B): the first boots of a round of
// P1 and of P1'. It returns the bare VM for the round's later boot. A
// failed bare boot is a NaN sample and an error of the figure; a failed
// agent-vm step ends it.
func newBranchRound(ctx context.Context, l *lab, f *report.Figure, prefix string, r int) (newBranch, *bareVM, error) {
	step := func(what string) { l.log.Printf("%s round %d/%d: %s", f.ID, r, l.cfg.Rounds, what) }
	var nb newBranch
	v, err := l.newVM(ctx, prefix)
	nb.vm, nb.create = v, v.create
	if err != nil {
		return nb, nil, err
	}
	step("agent-vm start " + v.name + " (first boot)")
	if nb.start, err = l.start(ctx, v, nil); err != nil {
		return nb, nil, err
	}
	st, err := l.av.status(ctx, v.name)
	if err != nil {
		return nb, nil, err
	}
	if err = l.stop(ctx, v); err != nil {
		return nb, nil, err
	}
	b, err := l.newBare(ctx, v, st, filepath.Join(l.dir, fmt.Sprintf("bare-%s-%d", prefix, r)))
	if err != nil {
		return nb, nil, err
	}
	step("bare QEMU (first boot)")
	nb.bare = l.bareBoot(ctx, f, b, fmt.Sprintf("round %d, bare first boot", r))
	l.newBranches = append(l.newBranches, nb)
	return nb, b, nil
}

// p1Later is a round's later boots: the bare guest again (B), then the
// VM (A).
func p1Later(ctx context.Context, l *lab, f *report.Figure, v *labVM, b *bareVM, r int) (bare float64, a bootTimes, err error) {
	l.log.Printf("P1 round %d/%d: bare QEMU (later boot)", r, l.cfg.Rounds)
	bare = l.bareBoot(ctx, f, b, fmt.Sprintf("round %d, bare later boot", r))
	l.log.Printf("P1 round %d/%d: agent-vm start %s (later boot)", r, l.cfg.Rounds, v.name)
	a, err = l.start(ctx, v, nil)
	return bare, a, err
}

// bareBoot boots b to SSH-ready and shuts it down; a failure is a NaN
// sample and an error of f.
func (l *lab) bareBoot(ctx context.Context, f *report.Figure, b *bareVM, what string) float64 {
	t, err1 := l.bootBare(ctx, b)
	err2 := l.shutdown(ctx, b)
	if err := firstErr(err1, err2); err != nil {
		f.Errors = append(f.Errors, fmt.Sprintf("%s: %v", what, err))
		return math.NaN()
	}
	return t
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
