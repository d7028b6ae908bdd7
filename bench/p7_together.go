package main

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strings"
)

// p7Groups are how many VMs start at once, in order: one alone before and
// after the groups is the reference, so drift over the figure shows.
func p7Groups() []int { return []int{1, 2, 3, 1} }

// runP7 starts 1, 2, 3, then 1 provisioned VMs at once (later boots, so
// cloud-init's first-boot work is not in it) and times until all are
// healthy, i.e. until the slowest `start` returns.
func runP7(ctx context.Context, l *lab, f *Figure) error {
	most := 0
	for _, k := range p7Groups() {
		most = max(most, k)
	}
	vms, err := l.provisioned(ctx, most)
	if err != nil {
		return err
	}
	all := map[int][]float64{}
	var rss, guestMiB []float64
	for _, k := range p7Groups() {
		group := vms[:k]
		l.log.Printf("P7: starting %d VM(s) at once", k)
		times, err := l.startTogether(ctx, group)
		if err != nil {
			f.Errors = append(f.Errors, fmt.Sprintf("%d at once: %v", k, err))
			all[k] = append(all[k], math.NaN())
		} else {
			slowest := 0.0
			var each []string
			for _, t := range times {
				slowest = max(slowest, t.Wall)
				each = append(each, fmt.Sprintf("%.1f s", t.Wall))
			}
			all[k] = append(all[k], slowest)
			f.Notes = append(f.Notes, fmt.Sprintf("%d at once: all healthy after %.1f s (each start: %s)", k, slowest, strings.Join(each, ", ")))
		}
		if k == most && err == nil {
			for _, v := range group {
				if st, err := l.av.status(ctx, v.name); err == nil && st.Pid > 0 {
					rss = append(rss, rssMiB(st.Pid))
					guestMiB = append(guestMiB, float64(st.Resources.MemoryMiB))
				}
			}
		}
		if err := l.stopAll(ctx); err != nil {
			return err
		}
	}
	alone := all[1]
	for _, k := range p7Groups() {
		if k == 1 || f.hasRow(fmt.Sprintf("P7.%d", k)) {
			continue
		}
		row := newRow(fmt.Sprintf("P7.%d", k), fmt.Sprintf("%d VMs started at once: until all are healthy (later boots)", k), "s",
			series(fmt.Sprintf("%d at once", k), all[k]), ref("1 VM alone", alone), false)
		if row.Ratio.N > 0 {
			row.Note = fmt.Sprintf("%.2f VMs per single-boot time; ideal on %d cores with 1-vCPU guests: %.0f", float64(k)/row.Ratio.Median, runtime.NumCPU(), math.Min(float64(k), float64(runtime.NumCPU())))
		}
		f.Rows = append(f.Rows, row)
	}
	f.Rows = append(f.Rows, newRow("P7.rss", fmt.Sprintf("QEMU resident memory per VM with %d running", most), "MiB",
		series("QEMU RSS", rss), ref("guest memory (-m)", guestMiB), true))
	f.Notes = append(f.Notes, "A ratio close to the number of VMs means starting them together gains nothing over one after the other: the boots are CPU-bound under TCG and share the cores. It stops scaling where the ratio grows as fast as the count.")
	return nil
}

func (f *Figure) hasRow(id string) bool {
	for _, r := range f.Rows {
		if r.ID == id {
			return true
		}
	}
	return false
}
