package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/bench/report"
)

// P12 is what an idle VM costs and how soon it answers again: the lab's
// running VM hibernated (`suspend --hibernate`: paused, its guest's memory
// moved to disk, its QEMU kept) and woken by `exec` and by a request to its
// MCP port, per round; then a fleet of new branches' VMs started from a
// template, each hibernated once settled, with three of the fleet running,
// and the host's memory.
func runP12(ctx context.Context, l *lab, f *report.Figure) error {
	v, err := l.running(ctx)
	if err != nil {
		return err
	}
	var hib, execWake, httpWake, pssRun, pssHib, tcgHib []float64
	for r := 1; r <= l.cfg.Rounds; r++ {
		l.log.Printf("P12 round %d/%d: hibernate %s, wake it by exec, hibernate, wake it by a request to its MCP port", r, l.cfg.Rounds, v.name)
		if err := l.settle(ctx, v); err != nil {
			return err
		}
		pssRun = append(pssRun, l.pssMiB(ctx, v.name))
		s, err := l.hibernate(ctx, v.name)
		if err != nil {
			return err
		}
		hib = append(hib, s)
		pss, tcg := l.pssParts(ctx, v.name)
		pssHib, tcgHib = append(pssHib, pss), append(tcgHib, tcg)
		res := l.av.run(ctx, quickTimeout, "exec", v.name, "--", "true")
		if res.Err != nil {
			return res.Err
		}
		execWake = append(execWake, res.Seconds())
		if _, err := l.hibernate(ctx, v.name); err != nil {
			return err
		}
		st, err := l.av.status(ctx, v.name)
		if err != nil {
			return err
		}
		began := time.Now()
		resp, err := (&http.Client{Timeout: quickTimeout, Transport: &http.Transport{}}).Get(fmt.Sprintf("http://127.0.0.1:%d/health", st.Ports.MCP))
		if err != nil {
			return fmt.Errorf("a request to the hibernated VM's MCP port: %w", err)
		}
		resp.Body.Close()
		httpWake = append(httpWake, time.Since(began).Seconds())
		if err := l.waitRunning(ctx, v.name); err != nil {
			return err
		}
	}
	h := report.NewRow("P12.hibernate", "`suspend --hibernate` of the running, settled VM, until it returns", "s", report.NewSeries("agent-vm suspend --hibernate", hib), nil, false)
	m := report.NewRow("P12.pss", "the VM's QEMU, hibernated: PSS", "MiB", report.NewSeries("hibernated", pssHib), report.Ref("the same QEMU running, settled, right before", pssRun), true)
	t := report.NewRow("P12.tcg", "of the hibernated QEMU's PSS, TCG's translation cache (its anonymous executable mappings; KVM has none)", "MiB", report.NewSeries("TCG cache", tcgHib), nil, false)
	e := report.NewRow("P12.exec", "`exec VM -- true` on the hibernated VM (it wakes, then runs the command)", "s", report.NewSeries("agent-vm exec", execWake), nil, false)
	e.Note = "goal (an attach to a hibernated VM answering): 3 s or less"
	w := report.NewRow("P12.http", "a request to agent-mcp's /health on the hibernated VM's forwarded MCP port, until answered", "s", report.NewSeries("GET /health", httpWake), nil, false)
	f.Rows = []*report.Row{h, m, t, e, w}
	f.Notes = append(f.Notes, "Per round: `systemctl is-system-running --wait` in the VM, its QEMU's PSS, `suspend --hibernate`, its QEMU's PSS, `exec -- true`, `suspend --hibernate`, `GET /health` on its MCP port (the holder sees the connection and runs `resume`), until `status` says running.")
	return l.p12Fleet(ctx, f, v)
}

// p12Fleet starts l.cfg.Fleet VMs of new branches from a template one
// after the other, hibernating each once settled; then it wakes two of
// them (three running with the lab's VM) and measures the host's memory
// and the VMs' QEMUs.
func (l *lab) p12Fleet(ctx context.Context, f *report.Figure, v *labVM) error {
	n := l.cfg.Fleet
	if n <= 0 {
		return nil
	}
	if err := l.stop(ctx, v); err != nil {
		return err
	}
	if err := l.buildTemplate(ctx, f, bootTimeout, v.name, "--agents", "none"); err != nil {
		return err
	}
	baseUsed := usedMiB()
	if _, err := l.start(ctx, v, nil); err != nil {
		return err
	}
	fleet := []*labVM{v}
	for i := 1; i < n; i++ {
		w, err := l.newVM(ctx, "p12")
		if err != nil {
			return err
		}
		l.log.Printf("P12 fleet: %d/%d: start %s and hibernate it", i+1, n, w.name)
		if _, err := l.start(ctx, w, nil); err != nil {
			return err
		}
		if err := l.settle(ctx, w); err != nil {
			return err
		}
		if _, err := l.hibernate(ctx, w.name); err != nil {
			return err
		}
		fleet = append(fleet, w)
	}
	if _, err := l.hibernate(ctx, v.name); err != nil {
		return err
	}
	// Three running: the lab's VM and the last two, woken as a user would.
	running := []*labVM{v, fleet[len(fleet)-1], fleet[len(fleet)-2]}
	for _, w := range running {
		if res := l.av.run(ctx, quickTimeout, "exec", w.name, "--", "true"); res.Err != nil {
			return res.Err
		}
	}
	time.Sleep(10 * time.Second) // the woken guests' catching up, not a wait for anything
	var runPSS, hibPSS, hibTCG, runTCG []float64
	for _, w := range fleet {
		pss, tcg := l.pssParts(ctx, w.name)
		if slices.Contains(running, w) {
			runPSS, runTCG = append(runPSS, pss), append(runTCG, tcg)
		} else {
			hibPSS, hibTCG = append(hibPSS, pss), append(hibTCG, tcg)
		}
	}
	used := usedMiB() - baseUsed
	sum := func(xs []float64) float64 {
		t := 0.0
		for _, x := range xs {
			t += x
		}
		return t
	}
	total := sum(runPSS) + sum(hibPSS)
	tcg := sum(runTCG) + sum(hibTCG)
	host := report.NewRow("P12.fleet", fmt.Sprintf("%d VMs of new branches, %d running and %d hibernated: the host's memory in use (MemTotal - MemAvailable) above what it was before they started", n, len(runPSS), len(hibPSS)), "MiB",
		report.NewSeries("host memory in use", []float64{used}), report.Ref("the sum of their QEMUs' PSS", []float64{total}), false)
	host.Note = fmt.Sprintf("goal: under 8 GiB (8192 MiB) for 20 VMs, 3 working, 17 hibernated; TCG's translation caches are %.0f MiB of the QEMUs' PSS (KVM has none)", tcg)
	each := report.NewRow("P12.fleet.each", "per VM of the fleet: its QEMU's PSS, hibernated", "MiB", report.NewSeries("hibernated", hibPSS), report.Ref("running", runPSS), true)
	f.Rows = append(f.Rows, host, each)
	f.Notes = append(f.Notes, fmt.Sprintf("Fleet: a template built from %s's machine; %d VMs (the lab's and %d new branches', %s of memory each) started one after the other, each settled and hibernated; then `exec -- true` woke three of them, and 10 s later the host's memory and each QEMU's PSS were read.", v.name, n, n-1, vmMemory))
	return nil
}

// hibernate runs `suspend --hibernate` and returns how long it took.
func (l *lab) hibernate(ctx context.Context, name string) (float64, error) {
	res := l.av.run(ctx, quickTimeout, "suspend", "--hibernate", name)
	if res.Err != nil {
		return 0, res.Err
	}
	if !strings.Contains(res.Stdout, "hibernated") {
		return 0, fmt.Errorf("`%s` did not hibernate the VM: %q", res.Line, tail(res.Stdout, 3))
	}
	return res.Seconds(), nil
}

// waitRunning waits until `status` says the VM runs.
func (l *lab) waitRunning(ctx context.Context, name string) error {
	for end := time.Now().Add(quickTimeout); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if st, err := l.av.status(ctx, name); err == nil && st.State == "running" {
			return nil
		}
	}
	return fmt.Errorf("%s is not running %s after the request that woke it", name, quickTimeout)
}

// pssParts are the VM's QEMU's PSS and, of it, TCG's translation cache
// (its anonymous executable mappings), in MiB.
func (l *lab) pssParts(ctx context.Context, name string) (pss, tcg float64) {
	st, err := l.av.status(ctx, name)
	if err != nil || st.Pid == 0 {
		return math.NaN(), math.NaN()
	}
	f, err := os.Open("/proc/" + strconv.Itoa(st.Pid) + "/smaps")
	if err != nil {
		return math.NaN(), math.NaN()
	}
	defer f.Close()
	exec := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) >= 5 && strings.Contains(fs[0], "-") && len(fs[1]) == 4:
			exec = fs[1] == "rwxp" && len(fs) == 5 // no path: anonymous
		case len(fs) == 3 && fs[0] == "Pss:":
			kb, _ := strconv.ParseFloat(fs[1], 64)
			pss += kb / 1024
			if exec {
				tcg += kb / 1024
			}
		}
	}
	return pss, tcg
}

// usedMiB is the host's memory in use: MemTotal - MemAvailable.
func usedMiB() float64 {
	kb := func(k string) float64 {
		n, _ := strconv.ParseFloat(strings.TrimSuffix(procField("/proc/meminfo", k), " kB"), 64)
		return n
	}
	return (kb("MemTotal") - kb("MemAvailable")) / 1024
}
