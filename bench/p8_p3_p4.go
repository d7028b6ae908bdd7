package main

import (
	"context"
	"fmt"
	"math"

	"github.com/agent-vm/agent-vm/bench/report"
)

// runP8 compares the overlays of the lab's VMs, measured right after their
// first boot and stop (P1's VMs, or one booted for this), with the base
// image.
func runP8(ctx context.Context, l *lab, f *report.Figure) error {
	var booted []*labVM
	for _, v := range l.vms {
		if v.overlay != nil {
			booted = append(booted, v)
		}
	}
	if len(booted) == 0 {
		if err := l.stopAll(ctx); err != nil {
			return err
		}
		v, err := l.newVM(ctx, "p8")
		if err != nil {
			return err
		}
		l.log.Printf("P8: first boot of %s", v.name)
		if _, err := l.start(ctx, v, nil); err != nil {
			return err
		}
		if err := l.stop(ctx, v); err != nil {
			return err
		}
		booted = append(booted, v)
	}
	img, err := baseImage(ctx, l.av)
	if err != nil {
		return fmt.Errorf("finding the base image: %w", err)
	}
	base, err := imageSize(ctx, img.Disk)
	if err != nil {
		return err
	}
	const mib = 1 << 20
	var alloc, file, baseAlloc, baseFile []float64
	for _, v := range booted {
		if v.overlay == nil {
			continue
		}
		alloc = append(alloc, float64(v.overlay.Allocated)/mib)
		file = append(file, float64(v.overlay.File)/mib)
		baseAlloc = append(baseAlloc, float64(base.Allocated)/mib)
		baseFile = append(baseFile, float64(base.File)/mib)
	}
	f.Rows = []*report.Row{
		report.NewRow("P8.allocated", "VM overlay after its first boot, allocated on disk (qemu-img actual-size)", "MiB",
			report.NewSeries("overlay", alloc), report.Ref("base image "+img.Name, baseAlloc), true),
		report.NewRow("P8.file", "VM overlay after its first boot, file size", "MiB",
			report.NewSeries("overlay", file), report.Ref("base image "+img.Name, baseFile), true),
	}
	f.Notes = append(f.Notes, "N is the number of VMs measured (each right after its first boot and stop); the base image is the same file every time. A new branch's VM costs the overlay, not another base image.")
	return nil
}

// runP3 times `agent-vm exec VM -- true` against OpenSSH running `true`
// with the VM's key and pinned host key, and against the floor: a session
// on an SSH connection already open to the guest, running `true`. The
// three alternate.
func runP3(ctx context.Context, l *lab, f *report.Figure) error {
	v, st, err := l.runningStatus(ctx)
	if err != nil {
		return err
	}
	t := sshTarget{Port: st.SSH.Port, User: st.SSH.User, Key: st.SSH.IdentityFile, KnownHosts: st.SSH.KnownHostsFile}
	h, err := dialHeld(t)
	if err != nil {
		return fmt.Errorf("the floor's connection: %w", err)
	}
	defer h.Close()
	execTrue := func() cmdResult { return l.av.run(ctx, quickTimeout, "exec", v.name, "--", "true") }
	sshTrue := func() cmdResult { return sshRun(ctx, t, quickTimeout, "true") }
	floorTrue := func() cmdResult { return h.run("true") }
	out, err := interleave(l.cfg.N, execTrue, sshTrue, floorTrue)
	a, b, floor := out[0], out[1], out[2]
	openssh := "OpenSSH `ssh -i KEY -p PORT dev@127.0.0.1 true`, pinned known_hosts"
	floorLabel := "a session on an open Go SSH connection, `true`"
	f.Rows = []*report.Row{
		report.NewRow("P3.exec", "`agent-vm exec VM -- true` round trip on a running VM", "ms",
			report.NewSeries("agent-vm exec", a), report.Ref(openssh, b), true),
		report.NewRow("P3.floor", "the floor: what the guest costs (a session running `true` on an open connection)", "ms",
			report.NewSeries(floorLabel, floor), report.Ref(openssh, b), true),
		report.NewRow("P3.over-floor", "`agent-vm exec VM -- true` against the floor", "ms",
			report.NewSeries("agent-vm exec", a), report.Ref(floorLabel, floor), true),
	}
	f.Rows[0].Note = "goal: 0.1 or less"
	f.Notes = append(f.Notes,
		"One unmeasured call of each first. OpenSSH opens a new SSH connection to the guest per call; agent-vm opens a session on the VM's held connection (`agent-vm __hold`, a local handshake on a unix socket) when its holder runs, which `status --json` shows as ssh.held.",
		"The floor is a session opened on one x/crypto/ssh connection to the guest, kept open by the harness: sshd forks, the guest's shell runs `true` and the channel closes, under TCG. P3.floor is the lowest P3.exec could reach; P3.over-floor is what agent-vm adds to it (starting the binary, finding the VM, the holder's local handshake).")
	return err
}

// runP4 times `status --json` of a running VM (when VMs can boot) and of a
// stopped one, against `agent-vm version`: the cost of starting the binary,
// which every command pays.
func runP4(ctx context.Context, l *lab, f *report.Figure) error {
	version := func() cmdResult { return l.av.run(ctx, quickTimeout, "version") }
	stopped, err := l.newVM(ctx, "p4")
	if err != nil {
		return err
	}
	a, b, err := alternate(l.cfg.N, func() cmdResult { return l.av.run(ctx, quickTimeout, "status", "--json", stopped.name) }, version)
	if err != nil {
		return err
	}
	f.Rows = append(f.Rows, report.NewRow("P4.stopped", "`status --json` of a stopped VM", "ms",
		report.NewSeries("agent-vm status --json", a), report.Ref("`agent-vm version`", b), true))
	if l.canBoot != "" {
		f.Notes = append(f.Notes, "status of a running VM not measured: "+l.canBoot)
		return nil
	}
	v, err := l.running(ctx)
	if err != nil {
		return err
	}
	a, b, err = alternate(l.cfg.N, func() cmdResult { return l.av.run(ctx, quickTimeout, "status", "--json", v.name) }, version)
	f.Rows = append(f.Rows, report.NewRow("P4.running", "`status --json` of a running VM (QMP query and agent-mcp /health included)", "ms",
		report.NewSeries("agent-vm status --json", a), report.Ref("`agent-vm version`", b), true))
	return err
}

// alternate runs a and b n times each, alternately; see interleave.
func alternate(n int, a, b func() cmdResult) (as, bs []float64, err error) {
	out, err := interleave(n, a, b)
	return out[0], out[1], err
}

// interleave runs each of fns n times, in turn (A/B/C/A/B/C ...), after
// one unmeasured call of each, and returns their wall times in
// milliseconds. A failed call is a NaN sample; the first error is
// returned.
func interleave(n int, fns ...func() cmdResult) ([][]float64, error) {
	for _, f := range fns {
		f()
	}
	out := make([][]float64, len(fns))
	var err error
	for i := 0; i < n; i++ {
		for j, f := range fns {
			res := f()
			if res.Err != nil {
				out[j] = append(out[j], math.NaN())
				if err == nil {
					err = res.Err
				}
				continue
			}
			out[j] = append(out[j], res.Seconds()*1000)
		}
	}
	return out, err
}
