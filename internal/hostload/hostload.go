// Package hostload reads how busy the host is and stretches boot timeouts
// by it, so that starting several VMs at once (`start --all`) on a busy
// host does not fail for want of CPU time.
//
// The formula (Scale): a base timeout, chosen for a host with a core free
// per booting VM, is multiplied by
//
//	factor = clamp((load1 + booting) / cores, 1, MaxFactor)
//
// where load1 is the one-minute load average (/proc/loadavg), booting is
// how many other VMs of agent-vm's are booting at the same time (their
// vCPU threads are about to add to the load, which the one-minute average
// shows only later) and cores is the number of CPUs this process may use.
// A quiet host keeps the base timeout; one whose runnable threads outnumber
// its cores by three (load 6 on 2 cores) waits three times as long; the
// factor stops at MaxFactor so a boot that truly hangs still ends.
package hostload

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// MaxFactor caps how much a timeout grows with load.
const MaxFactor = 4

// Load is how busy the host is at one moment.
type Load struct {
	Load1   float64 // one-minute load average
	Cores   int     // CPUs this process may run on
	Booting int     // other VMs booting at the same time
}

// Read reads the host's load; booting is the caller's count of other VMs
// booting. A host without /proc/loadavg reads as idle (Load1 0).
func Read(booting int) Load {
	l := Load{Cores: runtime.NumCPU(), Booting: booting}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		l.Load1, _ = parseLoadavg(string(b))
	}
	return l
}

// parseLoadavg reads the first field of /proc/loadavg.
func parseLoadavg(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("empty /proc/loadavg")
	}
	return strconv.ParseFloat(f[0], 64)
}

// Factor is how many times the base timeout this load allows (see the
// package doc).
func (l Load) Factor() float64 {
	cores := max(l.Cores, 1)
	f := (math.Max(l.Load1, 0) + float64(max(l.Booting, 0))) / float64(cores)
	return math.Min(math.Max(f, 1), MaxFactor)
}

// Scale is base stretched by the load's factor.
func (l Load) Scale(base time.Duration) time.Duration {
	return time.Duration(float64(base) * l.Factor())
}

// String says the load for an error message, e.g. "load 5.20 on 2 cores,
// 2 other VMs booting".
func (l Load) String() string {
	s := fmt.Sprintf("load %.2f on %d cores", l.Load1, l.Cores)
	switch l.Booting {
	case 0:
	case 1:
		s += ", 1 other VM booting"
	default:
		s += fmt.Sprintf(", %d other VMs booting", l.Booting)
	}
	return s
}

// TimeoutError is the cause of a Stretch context that ran out: the limit
// it reached and the busiest load seen while waiting.
type TimeoutError struct {
	Base, Limit time.Duration
	Peak        Load
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("timed out after %s (the limit, %s on an idle host, grew %.1fx with the host's %s; at most %dx)",
		e.Limit.Round(time.Second), e.Base, e.Peak.Factor(), e.Peak, MaxFactor)
}

// Unwrap makes a TimeoutError a context.DeadlineExceeded.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// Stretch returns a context that ends base scaled by the load after it is
// made. It reads the load (read) now and every every interval while it
// runs and moves its end later when the load has grown, never earlier: a
// boot that started on a quiet host and then met three others gets their
// time too. When it runs out, context.Cause is a *TimeoutError.
func Stretch(ctx context.Context, base, every time.Duration, read func() Load) (context.Context, context.CancelFunc) {
	began := time.Now()
	peak := read()
	cctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			end := time.Until(began.Add(peak.Scale(base)))
			if end <= 0 {
				cancel(&TimeoutError{Base: base, Limit: peak.Scale(base), Peak: peak})
				return
			}
			timer := time.NewTimer(end)
			select {
			case <-cctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			case <-t.C:
				timer.Stop()
			}
			if l := read(); l.Factor() > peak.Factor() {
				peak = l
			}
		}
	}()
	return cctx, func() { cancel(context.Canceled) }
}
