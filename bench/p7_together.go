package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// p7Groups are how many VMs start at once, in order: one alone before and
// after the groups is the reference, so drift over the figure shows. The
// environment variable BENCH_P7_GROUPS replaces the groups between the two
// single boots, e.g. BENCH_P7_GROUPS=3,6 (each VM has its first boot
// beforehand, as many at once as the largest group).
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

// runP7 starts 1, 2, 3, then 1 provisioned VMs at once (later boots, so
// cloud-init's first-boot work is not in it) and times until all are
// healthy, i.e. until the slowest `start` returns.
func runP7(ctx context.Context, l *lab, f *Figure) error {
	groups, err := p7Groups()
	if err != nil {
		return err
	}
	most := 0
	for _, k := range groups {
		most = max(most, k)
	}
	vms, err := l.provisioned(ctx, most)
	if err != nil {
		return err
	}
	all := map[int][]float64{}
	var rss, guestMiB, dropped []float64
	var parts []string
	for _, k := range groups {
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
			pids := map[*labVM]int{}
			for _, v := range group {
				if st, err := l.av.status(ctx, v.name); err == nil && st.Pid > 0 {
					pids[v] = st.Pid
					rss = append(rss, rssMiB(st.Pid))
					anon, shmem := rssParts(st.Pid)
					parts = append(parts, fmt.Sprintf("%.0f MiB (QEMU's own: %.0f, guest RAM: %.0f)", rss[len(rss)-1], anon, shmem))
					guestMiB = append(guestMiB, float64(st.Resources.MemoryMiB))
				}
			}
			// What the guests can give back: each drops its page cache;
			// with free page reporting the freed pages leave QEMU.
			for v, pid := range pids {
				if res := l.av.run(ctx, quickTimeout, "exec", v.name, "--", "sh", "-c", "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches >/dev/null; sleep 10"); res.Err != nil {
					f.Errors = append(f.Errors, fmt.Sprintf("dropping the guest's caches in %s: %v", v.name, res.Err))
					continue
				}
				dropped = append(dropped, rssMiB(pid))
			}
		}
		if err := l.stopAll(ctx); err != nil {
			return err
		}
	}
	alone := all[1]
	for _, k := range groups {
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
	if len(dropped) == len(rss) {
		f.Rows = append(f.Rows, newRow("P7.rss.dropped", "QEMU resident memory per VM after each guest dropped its page cache (10 s later)", "MiB",
			series("QEMU RSS", dropped), ref("guest memory (-m)", guestMiB), true))
	}
	if len(parts) > 0 {
		f.Notes = append(f.Notes, fmt.Sprintf("QEMU RSS of the %d VMs (QEMU's own anonymous memory, mostly TCG's translation cache; guest RAM it has touched, the shared memfd): %s.", most, strings.Join(parts, "; ")))
	}
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
