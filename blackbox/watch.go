package blackbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A Watch tells a slow run from a hung one. Machines of one kind differ by
// 1.5x and more, and a machine busy with two VMs is slower again, so no
// step of a run is given a time to finish in: a step is stopped only when
// nothing has moved for Limit, and the error says what it was waiting for.
//
// What counts as moving, sampled every few seconds:
//   - a line of output not seen before from a program the run drives
//     (Line). agent-vm repeats its progress line every 15 s with the time
//     elapsed, so lines are compared with their numbers left out: "waiting
//     for SSH (2m15s): Booting" is the same line at 2m30s;
//   - a file of Files growing (the guests' serial consoles);
//   - CPU time used by the machine's QEMUs, or by the process groups the
//     run is waiting on (Track): at least a quarter of a core over a sample.
//     An idle guest under TCG uses a few percent; a guest that boots,
//     installs packages or saves its memory uses a whole core.
//
// A guest spinning in a loop reads as moving: that hang is left to the
// limit of whoever runs the run (CI's), as is any other.
type Watch struct {
	// Limit is how long nothing may move before Context's contexts end.
	Limit time.Duration
	// Files lists the files whose growth counts (called at each sample;
	// nil: none).
	Files func() []string

	now   func() time.Time
	every time.Duration
	proc  string // /proc

	mu       sync.Mutex
	last     time.Time // when something last moved
	lastWhat string    // what it was
	seen     map[string]bool
	sizes    map[string]int64
	cpu      map[int]uint64 // ticks of each counted process at the last sample
	groups   map[int]int    // process groups tracked, with how many callers
	started  bool
	sampled  bool // a first sample was taken: later ones compare with it
}

// cpuShare is the part of one core the counted processes must use over a
// sample for it to count as moving.
const cpuShare = 0.25

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's CPU
// times: 100 on every Linux architecture Go runs VMs on.
const clockTicks = 100

// NewWatch returns a Watch with limit; Start begins its sampling.
func NewWatch(limit time.Duration, files func() []string) *Watch {
	return &Watch{Limit: limit, Files: files, now: time.Now, every: 5 * time.Second, proc: "/proc",
		seen: map[string]bool{}, sizes: map[string]int64{}, cpu: map[int]uint64{}, groups: map[int]int{}}
}

// Start samples until ctx ends. Until it is called only Line moves.
func (w *Watch) Start(ctx context.Context) {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return
	}
	w.started = true
	w.last, w.lastWhat = w.now(), "the run began"
	w.mu.Unlock()
	w.sample() // the baseline: what is there now does not count
	go func() {
		t := time.NewTicker(w.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				w.sample()
			}
		}
	}()
}

// digits are left out when lines are compared.
var digits = regexp.MustCompile(`[0-9]+`)

// Line notes a line of output; a line not seen before (numbers aside)
// moves.
func (w *Watch) Line(line string) {
	key := digits.ReplaceAllString(strings.TrimSpace(line), "#")
	if key == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.seen[key] {
		w.seen[key] = true
		w.moved("output: " + line)
	}
}

// Track counts the CPU time of process group pgid (a program the run
// waits on, with what it runs) until the returned function is called.
func (w *Watch) Track(pgid int) (untrack func()) {
	w.mu.Lock()
	w.groups[pgid]++
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.groups[pgid]--; w.groups[pgid] <= 0 {
			delete(w.groups, pgid)
		}
	}
}

// moved records that something moved now. Called with mu held.
func (w *Watch) moved(what string) {
	w.last, w.lastWhat = w.now(), what
}

// Idle is how long nothing has moved, and the last thing that did.
func (w *Watch) Idle() (time.Duration, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last.IsZero() {
		return 0, ""
	}
	return w.now().Sub(w.last), w.lastWhat
}

// sample reads the files' sizes and the counted processes' CPU time.
func (w *Watch) sample() {
	var files []string
	if w.Files != nil {
		files = w.Files()
	}
	sizes := map[string]int64{}
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			sizes[f] = fi.Size()
		}
	}
	w.mu.Lock()
	groups := make(map[int]bool, len(w.groups))
	for g := range w.groups {
		groups[g] = true
	}
	w.mu.Unlock()
	cpu := w.readCPU(groups)

	w.mu.Lock()
	defer w.mu.Unlock()
	first := !w.sampled
	w.sampled = true
	for f, n := range sizes {
		if old, ok := w.sizes[f]; (ok && n > old) || (!ok && n > 0 && !first) {
			w.moved("the file " + f + " grew")
		}
	}
	w.sizes = sizes
	var used uint64
	for pid, t := range cpu {
		if old, ok := w.cpu[pid]; ok && t > old {
			used += t - old
		}
	}
	w.cpu = cpu
	if !first && float64(used) >= cpuShare*clockTicks*w.every.Seconds() {
		w.moved(fmt.Sprintf("QEMU or a program the run waits on used %.1f s of CPU in %s", float64(used)/clockTicks, w.every))
	}
}

// readCPU is the CPU time, in clock ticks, of each QEMU on the machine and
// each process in groups.
func (w *Watch) readCPU(groups map[int]bool) map[int]uint64 {
	out := map[int]uint64{}
	dirs, _ := filepath.Glob(filepath.Join(w.proc, "[0-9]*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		comm, pgrp, ticks, ok := parseStat(b)
		if ok && (strings.HasPrefix(comm, "qemu-system") || groups[pgrp]) {
			out[pid] = ticks
		}
	}
	return out
}

// parseStat reads /proc/PID/stat: the command name, the process group and
// user plus system time in clock ticks.
func parseStat(b []byte) (comm string, pgrp int, ticks uint64, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, 0, false
	}
	comm = string(b[open+1 : end])
	// After "(comm) ": state(3) ppid(4) pgrp(5) ... utime(14) stime(15).
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 13 {
		return "", 0, 0, false
	}
	pgrp, err1 := strconv.Atoi(f[2])
	ut, err2 := strconv.ParseUint(f[11], 10, 64)
	st, err3 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return "", 0, 0, false
	}
	return comm, pgrp, ut + st, true
}

// StallError is why a Watch's context ended: nothing moved for Limit.
type StallError struct {
	Limit time.Duration
	// Waiting is what the stopped step was waiting for.
	Waiting string
	// Last is the last thing that moved, before the stall.
	Last string
}

func (e *StallError) Error() string {
	s := fmt.Sprintf("no progress for %s (no new output, no guest console output, QEMU and the programs waited on idle)", e.Limit)
	if e.Waiting != "" {
		s += " while waiting for " + e.Waiting
	}
	if e.Last != "" {
		s += "; the last thing that moved: " + e.Last
	}
	return s
}

// Context returns a context that ends, with a *StallError as its cause,
// once nothing has moved for Limit; waiting says what the step waits for
// (called when it stalls). The watch must have been started.
func (w *Watch) Context(ctx context.Context, waiting func() string) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(min(w.every, time.Second))
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case <-t.C:
			}
			if idle, last := w.Idle(); idle >= w.Limit {
				e := &StallError{Limit: w.Limit, Last: last}
				if waiting != nil {
					e.Waiting = waiting()
				}
				cancel(e)
				return
			}
		}
	}()
	return cctx, func() { cancel(context.Canceled) }
}

// NewTestWatch is NewWatch for tests of the programs that use a Watch:
// sampled every every, counting the QEMUs of proc (a directory laid out
// as /proc; an empty one: none).
func NewTestWatch(limit, every time.Duration, proc string) *Watch {
	w := NewWatch(limit, nil)
	w.every, w.proc = every, proc
	return w
}
