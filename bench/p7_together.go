package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/bench/report"
)

// p7Groups are how many VMs start at once, in order: one alone before and
// after the groups is the reference, so drift over the figure shows. The
// environment variable BENCH_P7_GROUPS replaces the groups between the two
// single boots, e.g. BENCH_P7_GROUPS=3,6 (each VM has its first boot
// beforehand, as many at once as the host has cores).
func p7Groups() ([]int, error) {
	groups := []int{1}
	env := strings.TrimSpace(os.Getenv("BENCH_P7_GROUPS"))
	if env == "" {
		env = "2,3"
	}
	for _, s := range strings.Split(env, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 2 || k > 16 {
			return nil, fmt.Errorf("BENCH_P7_GROUPS=%q: %q is not a number of VMs from 2 to 16 (hint: e.g. BENCH_P7_GROUPS=2,3,6)", env, s)
		}
		groups = append(groups, k)
	}
	return append(groups, 1), nil
}

// p7Goal is how many VMs the project means to run at once, all healthy.
const p7Goal = 6

// runP7 starts 1, 2, 3, then 1 provisioned VMs at once (later boots, so
// cloud-init's first-boot work is not in it) and times until all are
// healthy, i.e. until the slowest `start` returns. A group of which some
// do not become healthy is measured too: its rows say how many did.
func runP7(ctx context.Context, l *lab, f *report.Figure) error {
	groups, err := p7Groups()
	if err != nil {
		return err
	}
	most := slices.Max(groups)
	vms, err := l.provisioned(ctx, most)
	if err != nil {
		return err
	}
	all, healthy := map[int][]float64{}, map[int][]float64{}
	var memory []*report.Row
	for _, k := range groups {
		l.log.Printf("P7: starting %d VM(s) at once", k)
		up, slowest := p7Start(ctx, l, f, vms[:k])
		all[k], healthy[k] = append(all[k], slowest), append(healthy[k], float64(len(up)))
		if k == 1 && len(up) == 0 {
			f.Errors = append(f.Errors, "the VM alone (the reference) did not become healthy")
		}
		if k == most && len(up) > 0 {
			memory = p7Memory(ctx, l, f, up)
		}
		if err := l.stopAll(ctx); err != nil {
			f.Errors = append(f.Errors, fmt.Sprintf("stopping the VMs after %d at once: %v", k, err))
			break
		}
	}
	f.Rows = append(p7Rows(groups, all, healthy), memory...)
	f.Notes = append(f.Notes, "A ratio close to the number of VMs means starting them together gains nothing over one after the other: the boots are CPU-bound under TCG and share the cores. It stops scaling where the ratio grows as fast as the count.")
	return nil
}

// p7Rows are the rows of the groups measured: for each size but 1, the
// time until all were healthy (NaN: not all became healthy) against the
// VM alone, and how many became healthy of those started.
func p7Rows(groups []int, all, healthy map[int][]float64) []*report.Row {
	var rows []*report.Row
	done := map[int]bool{1: true}
	for _, k := range groups {
		if done[k] || len(all[k]) == 0 {
			continue
		}
		done[k] = true
		row := report.NewRow(fmt.Sprintf("P7.%d", k), fmt.Sprintf("%d VMs started at once: until all are healthy (later boots)", k), "s",
			report.NewSeries(fmt.Sprintf("%d at once", k), all[k]), report.Ref("1 VM alone", all[1]), false)
		if row.Ratio.N > 0 {
			row.Note = fmt.Sprintf("%.2f VMs per single-boot time; ideal on %d cores with 1-vCPU guests: %.0f", float64(k)/row.Ratio.Median, runtime.NumCPU(), math.Min(float64(k), float64(runtime.NumCPU())))
		}
		started := make([]float64, len(healthy[k]))
		for i := range started {
			started[i] = float64(k)
		}
		ok := report.NewRow(fmt.Sprintf("P7.%d.healthy", k), fmt.Sprintf("%d VMs started at once: how many became healthy", k), "VMs",
			report.NewSeries("healthy", healthy[k]), report.Ref("started", started), true)
		if k == p7Goal {
			ok.Note = fmt.Sprintf("goal: all %d", p7Goal)
		}
		rows = append(rows, row, ok)
	}
	return rows
}

// p7Start starts group at once and returns the VMs that became healthy
// and the time until all had (NaN when some did not). A VM that fails is
// a note, not an error: how many of a group become healthy is part of
// the figure.
func p7Start(ctx context.Context, l *lab, f *report.Figure, group []*labVM) (up []*labVM, slowest float64) {
	times, errs := l.startTogether(ctx, group)
	var each, failed []string
	for i, v := range group {
		if errs[i] != nil {
			each = append(each, "failed")
			failed = append(failed, fmt.Sprintf("%s: %v", v.name, errs[i]))
			continue
		}
		up = append(up, v)
		slowest = max(slowest, times[i].Wall)
		each = append(each, fmt.Sprintf("%.1f s", times[i].Wall))
	}
	k := len(group)
	if len(failed) == 0 {
		f.Notes = append(f.Notes, fmt.Sprintf("%d at once: all healthy after %.1f s (each start: %s)", k, slowest, strings.Join(each, ", ")))
		return up, slowest
	}
	f.Notes = append(f.Notes, fmt.Sprintf("%d at once: %d of %d became healthy (each start: %s); %s", k, len(up), k, strings.Join(each, ", "), strings.Join(failed, "; ")))
	return up, math.NaN()
}

// p7Memory is the rows of QEMU's resident memory per VM with the healthy
// VMs of the largest group running, before and after each guest dropped
// its page cache.
func p7Memory(ctx context.Context, l *lab, f *report.Figure, up []*labVM) []*report.Row {
	var rss, guestMiB, dropped []float64
	var parts []string
	pids := map[*labVM]int{}
	for _, v := range up {
		if st, err := l.av.status(ctx, v.name); err == nil && st.Pid > 0 {
			pids[v] = st.Pid
			rss = append(rss, rssMiB(st.Pid))
			anon, shmem := rssParts(st.Pid)
			parts = append(parts, fmt.Sprintf("%.0f MiB (QEMU's own: %.0f, guest RAM: %.0f)", rss[len(rss)-1], anon, shmem))
			guestMiB = append(guestMiB, float64(st.Resources.MemoryMiB))
		}
	}
	// What the guests can give back: each drops its page cache; with free
	// page reporting the freed pages leave QEMU.
	for v, pid := range pids {
		if res := l.av.run(ctx, quickTimeout, "exec", v.name, "--", "sh", "-c", "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches >/dev/null; sleep 10"); res.Err != nil {
			f.Errors = append(f.Errors, fmt.Sprintf("dropping the guest's caches in %s: %v", v.name, res.Err))
			continue
		}
		dropped = append(dropped, rssMiB(pid))
	}
	row := report.NewRow("P7.rss", fmt.Sprintf("QEMU resident memory per VM with %d running", len(up)), "MiB",
		report.NewSeries("QEMU RSS", rss), report.Ref("guest memory (-m)", guestMiB), true)
	row.Note = "goal: 300 MiB or less"
	rows := []*report.Row{row}
	if len(dropped) == len(rss) {
		rows = append(rows, report.NewRow("P7.rss.dropped", "QEMU resident memory per VM after each guest dropped its page cache (10 s later)", "MiB",
			report.NewSeries("QEMU RSS", dropped), report.Ref("guest memory (-m)", guestMiB), true))
	}
	if len(parts) > 0 {
		f.Notes = append(f.Notes, fmt.Sprintf("QEMU RSS of the %d VMs (QEMU's own anonymous memory, mostly TCG's translation cache; guest RAM it has touched, the shared memfd): %s.", len(up), strings.Join(parts, "; ")))
	}
	return rows
}

// rssParts are a process's anonymous and shared resident memory in MiB:
// for QEMU, its own (TCG's translation cache, its heap) and the guest RAM
// it has touched (a shared memfd when the workspace is over virtiofs).
func rssParts(pid int) (anon, shmem float64) {
	read := func(field string) float64 {
		kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(procField("/proc/"+strconv.Itoa(pid)+"/status", field), " kB")))
		return float64(kb) / 1024
	}
	return read("RssAnon"), read("RssShmem")
}
