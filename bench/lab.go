package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// lab holds what a run makes: a temp directory with agent-vm state
// directories, source repositories and bare QEMU boots, and the VMs made
// in them. Figures share its VMs (a boot costs a minute or more), and it
// removes everything at the end, whatever happened.
type lab struct {
	cfg config
	log *logger
	dir string
	av  *agentVM // the state directory of the VMs that boot
	// others are further state directories (P5's records), cleaned alike.
	others []*agentVM

	mu        sync.Mutex
	vms       []*labVM
	bares     map[*bareVM]struct{}
	usedPorts map[int]bool // MCP ports given to the lab's VMs

	repo, tar string // the source tree as a git repository and as a tarball
	treeFiles int
	// canBoot is why VMs cannot boot here, "" when they can.
	canBoot string
	// newBranches are the new branches' first boots so far (P1 makes
	// some; P1' reads them rather than booting more).
	newBranches []newBranch
	// templates are the templates the lab built (P1'), removed at cleanup:
	// they live in the user's cache, not in the lab's directory.
	templates []string
}

// labVM is a VM the lab created, and what the lab knows of it.
type labVM struct {
	name    string
	create  float64 // seconds its `create` took
	booted  bool    // it has had its first boot (cloud-init ran)
	running bool
	share   string   // virtiofs or 9p, while running
	argv    []string // its QEMU command line, read from /proc at its first boot
	// overlay is its disk's size after the first boot, before any other.
	overlay *diskSize
	// noOverlay: it was used before its first stop, so its overlay is not
	// one after a first boot alone (P8 does not count it).
	noOverlay bool
}

// guest size for every VM the harness boots: small enough for three at
// once on the smallest machine the project runs on.
const (
	vmCPUs   = "1"
	vmMemory = "1G"
)

func newLab(cfg config, log *logger, bin string) (*lab, error) {
	dir, err := os.MkdirTemp("", "agent-vm-bench-")
	if err != nil {
		return nil, fmt.Errorf("creating the lab's temp dir: %w", err)
	}
	l := &lab{cfg: cfg, log: log, dir: dir, bares: map[*bareVM]struct{}{}, usedPorts: map[int]bool{}}
	l.av = l.stateDir("state")
	l.av.bin = bin
	return l, nil
}

// stateDir is an agent-vm with a state directory of its own in the lab.
func (l *lab) stateDir(name string) *agentVM {
	a := &agentVM{stateDir: filepath.Join(l.dir, name), dir: l.dir}
	if l.av != nil {
		a.bin = l.av.bin
		l.others = append(l.others, a)
	}
	return a
}

// newVM creates a VM from the source repository.
func (l *lab) newVM(ctx context.Context, prefix string) (*labVM, error) {
	v, flags, err := l.vmFlags(ctx, prefix)
	if err != nil {
		return v, err
	}
	res := l.av.run(ctx, quickTimeout, append([]string{"create", "--branch", v.name}, flags...)...)
	v.create = res.Seconds()
	return v, res.Err
}

// vmFlags names a new VM of the lab's and returns the flags that create
// it (create's, which run takes too): the source repository, the qemu
// backend, the lab's guest size and an MCP port of its own.
func (l *lab) vmFlags(ctx context.Context, prefix string) (*labVM, []string, error) {
	repo, err := l.sourceRepo(ctx)
	if err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	v := &labVM{name: fmt.Sprintf("bench-%s-%d", prefix, len(l.vms)+1)}
	l.vms = append(l.vms, v)
	port, err := l.mcpPort()
	l.mu.Unlock()
	return v, []string{"--repo", repo, "--backend", "qemu", "--cpus", vmCPUs, "--memory", vmMemory, "--port", strconv.Itoa(port)}, err
}

// mcpPort picks a free MCP port at random from the upper half of
// agent-vm's MCP range. agent-vm picks the lowest free port at create and
// checks it again only at start, so VMs of another state directory (the
// integration tests running beside the harness) would otherwise collide
// with the harness's on 8000, 8001 ... The caller holds l.mu.
func (l *lab) mcpPort() (int, error) {
	for range 100 {
		p := 8500 + rand.IntN(500)
		if portFree(p) && !l.usedPorts[p] {
			l.usedPorts[p] = true
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port in 8500-8999 on 127.0.0.1")
}

// waitPorts waits (up to 10 minutes) until a stopped VM's ports are free:
// a VM of another state directory may hold one (agent-vm's SSH port is
// not chosen by the harness), and start would refuse it.
func (l *lab) waitPorts(ctx context.Context, v *labVM) error {
	st, err := l.av.status(ctx, v.name)
	if err != nil || st.State != "stopped" {
		return err
	}
	deadline := time.Now().Add(10 * time.Minute)
	for delay, said := time.Second, false; ; delay = min(2*delay, 15*time.Second) {
		busy := 0
		for _, p := range []int{st.Ports.SSH, st.Ports.MCP} {
			if !portFree(p) {
				busy = p
			}
		}
		if busy == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("port %d of %s stayed in use by another program for 10 minutes", busy, v.name)
		}
		if !said {
			l.log.Printf("port %d of %s is in use by another program (a VM of another state directory?); waiting for it", busy, v.name)
			said = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// portFree reports whether 127.0.0.1:port can be bound now.
func portFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// start boots v (prefix: see agentVM.spec; flags: more of start's flags)
// and, at its first boot, keeps its QEMU command line.
func (l *lab) start(ctx context.Context, v *labVM, prefix []string, flags ...string) (bootTimes, error) {
	if err := l.waitPorts(ctx, v); err != nil {
		return bootTimes{}, err
	}
	t, err := l.av.start(ctx, v.name, prefix, flags...)
	v.running = true // a boot that failed may leave QEMU running; stop will see
	if err != nil {
		return t, err
	}
	v.booted, v.share = true, t.Share
	if v.argv == nil {
		st, err := l.av.status(ctx, v.name)
		if err != nil {
			return t, err
		}
		if v.argv = blackbox.Cmdline(st.Pid); v.argv == nil {
			return t, fmt.Errorf("reading the QEMU command line of %s (pid %d) from /proc", v.name, st.Pid)
		}
	}
	return t, nil
}

// stop shuts v down; after its first boot, it measures the overlay.
func (l *lab) stop(ctx context.Context, v *labVM) error {
	if res := l.av.run(ctx, stopTimeout, "stop", v.name); res.Err != nil {
		return res.Err
	}
	v.running = false
	if v.overlay == nil && v.argv != nil && !v.noOverlay {
		disk, err := overlayPath(v.argv)
		if err != nil {
			return err
		}
		sz, err := imageSize(ctx, disk)
		if err != nil {
			return err
		}
		v.overlay = &sz
	}
	return nil
}

// stopAll stops every VM of the lab's that runs, at once.
func (l *lab) stopAll(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(l.vms))
	for i, v := range l.vms {
		if !v.running {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = l.stop(ctx, v) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// provisioned returns k VMs that have had their first boot, stopped,
// creating and booting those missing, as many at once as the host has
// cores (a first boot runs cloud-init: many at once on a few cores could
// outlast start's timeout, and P7 does not time them).
func (l *lab) provisioned(ctx context.Context, k int) ([]*labVM, error) {
	var have []*labVM
	for _, v := range l.vms {
		if v.booted && len(have) < k {
			have = append(have, v)
		}
	}
	var fresh []*labVM
	for len(have)+len(fresh) < k {
		v, err := l.newVM(ctx, "vm")
		if err != nil {
			return nil, err
		}
		fresh = append(fresh, v)
	}
	if len(fresh) > 0 {
		l.log.Printf("first boot of %d VM(s) for later figures (cloud-init runs once per VM)", len(fresh))
		if err := l.stopAll(ctx); err != nil {
			return nil, err
		}
		for batch := range slices.Chunk(fresh, max(1, runtime.NumCPU())) {
			_, errs := l.startTogether(ctx, batch)
			if err := errors.Join(errs...); err != nil {
				return nil, err
			}
		}
	}
	return append(have, fresh...), l.stopAll(ctx)
}

// startTogether starts vms at once and returns each one's boot times and
// error.
func (l *lab) startTogether(ctx context.Context, vms []*labVM) ([]bootTimes, []error) {
	times := make([]bootTimes, len(vms))
	errs := make([]error, len(vms))
	var wg sync.WaitGroup
	for i, v := range vms {
		wg.Add(1)
		go func() { defer wg.Done(); times[i], errs[i] = l.start(ctx, v, nil) }()
	}
	wg.Wait()
	return times, errs
}

// running returns a VM that runs alone with the workspace over virtiofs,
// booted and settled.
func (l *lab) running(ctx context.Context) (*labVM, error) {
	for _, v := range l.vms {
		if v.running && v.share == "virtiofs" {
			for _, o := range l.vms {
				if o != v && o.running {
					if err := l.stop(ctx, o); err != nil {
						return nil, err
					}
				}
			}
			return v, l.settle(ctx, v)
		}
	}
	if err := l.stopAll(ctx); err != nil {
		return nil, err
	}
	var v *labVM
	for _, o := range l.vms {
		if o.booted {
			v = o
			break
		}
	}
	if v == nil { // a first boot, kept running rather than booted twice
		var err error
		if v, err = l.newVM(ctx, "vm"); err != nil {
			return nil, err
		}
		v.noOverlay = true
	}
	l.log.Printf("starting %s", v.name)
	if _, err := l.start(ctx, v, nil); err != nil {
		return nil, err
	}
	return v, l.settle(ctx, v)
}

// runningStatus is running's VM and its `status --json`.
func (l *lab) runningStatus(ctx context.Context) (*labVM, *blackbox.Status, error) {
	v, err := l.running(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, err := l.av.status(ctx, v.name)
	return v, st, err
}

// settle waits until the guest's boot has finished (systemd has run every
// start-up job), so a measurement does not compete with it.
func (l *lab) settle(ctx context.Context, v *labVM) error {
	res := l.av.run(ctx, 10*time.Minute, "exec", v.name, "--", "systemctl", "is-system-running", "--wait")
	if res.Err != nil && res.Exit != 1 { // 1: degraded, which is settled too
		return res.Err
	}
	return nil
}

// cleanup stops and removes everything the lab made: bare QEMUs, VMs (in
// every state directory of the lab), stray processes that still name the
// lab's directory, and the directory. It reports each problem.
func (l *lab) cleanup(ctx context.Context) error {
	var problems []error
	l.mu.Lock()
	bares := make([]*bareVM, 0, len(l.bares))
	for b := range l.bares {
		bares = append(bares, b)
	}
	l.mu.Unlock()
	for _, b := range bares {
		b.kill()
	}
	for _, a := range append([]*agentVM{l.av}, l.others...) {
		if _, err := os.Stat(a.stateDir); err != nil {
			continue
		}
		list, err := a.list(ctx)
		if err != nil {
			problems = append(problems, err)
		}
		for _, st := range list {
			if st.State != "stopped" && st.State != "invalid" {
				if res := a.run(ctx, stopTimeout, "stop", st.Branch); res.Err != nil {
					problems = append(problems, res.Err)
				}
			}
			if a == l.av { // the others are never started: removing the directory is enough
				if res := a.run(ctx, quickTimeout, "destroy", "--force", st.Branch); res.Err != nil {
					problems = append(problems, res.Err)
				}
			}
		}
	}
	if err := l.removeTemplates(ctx); err != nil {
		problems = append(problems, err)
	}
	for _, p := range blackbox.Processes() {
		if p.Mentions(l.dir) {
			_ = syscall.Kill(p.Pid, syscall.SIGKILL)
			problems = append(problems, fmt.Errorf("pid %d (%s) still used the lab's directory after cleanup; killed it", p.Pid, p.Name()))
		}
	}
	if err := os.RemoveAll(l.dir); err != nil {
		problems = append(problems, fmt.Errorf("removing %s: %w", l.dir, err))
	}
	return errors.Join(problems...)
}

// removeTemplates removes the templates the lab built: they live in the
// user's cache, not in the lab's directory. A template removed while VMs
// started from it exist stays listed as their disk, and goes once they
// do, at a later call: the names are kept for the cleanup. One that a
// later build replaced may be gone already.
func (l *lab) removeTemplates(ctx context.Context) error {
	l.mu.Lock()
	ts := slices.Clone(l.templates)
	l.mu.Unlock()
	if len(ts) == 0 {
		return nil
	}
	res := l.av.run(ctx, quickTimeout, "template", "list", "--json")
	if res.Err != nil {
		return res.Err
	}
	var listed []struct {
		Slug string `json:"slug"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &listed); err != nil {
		return fmt.Errorf("reading `%s`: %w", res.Line, err)
	}
	present := map[string]bool{}
	for _, t := range listed {
		present[t.Slug] = true
	}
	var problems []error
	for _, t := range ts {
		if !present[t] {
			continue
		}
		if res := l.av.run(ctx, quickTimeout, "template", "rm", t); res.Err != nil {
			problems = append(problems, res.Err)
		}
	}
	return errors.Join(problems...)
}
