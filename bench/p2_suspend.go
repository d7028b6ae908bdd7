package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/bench/report"
)

// savedOnDisk is the disk a suspended VM's saved state takes in its
// directory: internal/qemu's StateFile (the devices, and the guest's RAM
// where it is not apart) and RAMFile (the RAM's data, a sparse file whose
// holes take nothing), by the blocks each has.
func savedOnDisk(vmDir string) (int64, error) {
	var n int64
	for _, f := range []string{"suspend.state", "suspend.ram"} {
		var st syscall.Stat_t
		err := syscall.Stat(filepath.Join(vmDir, "run", f), &st)
		if f == "suspend.ram" && errors.Is(err, os.ErrNotExist) {
			continue // the RAM is in the stream
		}
		if err != nil {
			return 0, err
		}
		n += st.Blocks * 512
	}
	return n, nil
}

// runP2 is P2: per round, the running VM is suspended and
// resumed (A), then stopped and started cold (B), so resume and a cold
// boot of the same VM alternate. It also times suspend against stop (the
// other way to free the VM's CPU and memory) and weighs the saved state
// against the guest's memory.
func runP2(ctx context.Context, l *lab, f *report.Figure) error {
	v, st, err := l.runningStatus(ctx)
	if err != nil {
		return err
	}
	var p p2Samples
	for r := 1; r <= l.cfg.Rounds; r++ {
		if err := p2Round(ctx, l, v, st.Paths.Dir, float64(st.Resources.MemoryMiB), r, &p); err != nil {
			f.Rows = p.rows()
			return err
		}
	}
	f.Rows = p.rows()
	f.Notes = append(f.Notes,
		"Each round: `suspend` of the running, settled VM (the guest unmounts /workspace and stops agent-mcp, QEMU unplugs the share and saves the guest to the VM's run directory, QEMU quits), `resume` (QEMU loads the state, the share is plugged in again, the guest's clock is set, /workspace is mounted and agent-mcp started), then `stop` and a cold `start` of the same VM (a later boot: no cloud-init). The last VM is left running.",
		"`ssh` counts from running `resume` (or `start`) to agent-vm seeing SSH answer (its \"ssh ready\" debug log); `health` is resume's whole run. The goal for P2.ssh: 0.1 or less.")
	return nil
}

// p2Samples are P2's samples, one per round.
type p2Samples struct {
	resumeSSH, resumeHealth, coldSSH, suspend, stop, state, memory []float64
}

func (p *p2Samples) rows() []*report.Row {
	cold := report.Ref("cold boot of the same VM (`start` after `stop`), to SSH-ready", p.coldSSH)
	return []*report.Row{
		report.NewRow("P2.ssh", "`resume` -> SSH-ready", "s", report.NewSeries("agent-vm resume", p.resumeSSH), cold, true),
		report.NewRow("P2.health", "`resume` -> agent-mcp healthy (resume returns)", "s", report.NewSeries("agent-vm resume", p.resumeHealth), cold, true),
		report.NewRow("P2.suspend", "`suspend` of a running VM, until it returns", "s",
			report.NewSeries("agent-vm suspend", p.suspend), report.Ref("`agent-vm stop` of the same VM (ACPI shutdown)", p.stop), true),
		report.NewRow("P2.state", "saved state on disk (the suspended VM's cost)", "MiB",
			report.NewSeries("state files' blocks", p.state), report.Ref("guest memory (-m)", p.memory), true),
	}
}

// p2Round is one round of P2 on the running VM v (directory dir, memMiB
// of guest memory).
func p2Round(ctx context.Context, l *lab, v *labVM, dir string, memMiB float64, r int, p *p2Samples) error {
	step := func(what string) { l.log.Printf("P2 round %d/%d: %s", r, l.cfg.Rounds, what) }
	if err := l.settle(ctx, v); err != nil {
		return err
	}
	step("agent-vm suspend " + v.name)
	sus := l.av.run(ctx, stopTimeout, "suspend", v.name)
	if sus.Err != nil {
		return sus.Err
	}
	saved, err := savedOnDisk(dir)
	if err != nil {
		return fmt.Errorf("after suspend: %w", err)
	}
	step("agent-vm resume " + v.name)
	res, err := l.av.resume(ctx, v.name)
	if err != nil {
		return err
	}
	step("agent-vm stop " + v.name)
	began := time.Now()
	if err := l.stop(ctx, v); err != nil {
		return err
	}
	stop := time.Since(began).Seconds()
	step("agent-vm start " + v.name + " (cold, later boot)")
	cold, err := l.start(ctx, v, nil)
	if err != nil {
		return err
	}
	p.resumeSSH, p.resumeHealth = append(p.resumeSSH, res.SSHWall), append(p.resumeHealth, res.Wall)
	p.coldSSH = append(p.coldSSH, cold.SSHWall)
	p.suspend, p.stop = append(p.suspend, sus.Seconds()), append(p.stop, stop)
	p.state, p.memory = append(p.state, float64(saved)/(1<<20)), append(p.memory, memMiB)
	l.log.Printf("P2 round %d: suspend %.1fs (state %d MiB), resume SSH %.1fs healthy %.1fs; stop %.1fs, cold start SSH %.1fs",
		r, sus.Seconds(), saved>>20, res.SSHWall, res.Wall, stop, cold.SSHWall)
	return nil
}
