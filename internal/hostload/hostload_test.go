package hostload

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestFactor(t *testing.T) {
	tests := []struct {
		name string
		l    Load
		want float64
	}{
		{"idle host keeps the base", Load{Load1: 0.3, Cores: 2}, 1},
		{"one busy core of two", Load{Load1: 1, Cores: 2}, 1},
		{"load 6 on 2 cores", Load{Load1: 6, Cores: 2}, 3},
		{"booting VMs count before the average shows them", Load{Load1: 2, Cores: 2, Booting: 2}, 2},
		{"capped", Load{Load1: 40, Cores: 2, Booting: 5}, MaxFactor},
		{"no core count reads as one", Load{Load1: 3}, 3},
		{"negative nonsense is idle", Load{Load1: -1, Cores: 4, Booting: -3}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.l.Factor(); got != tt.want {
				t.Errorf("Factor(%+v) = %v, want %v", tt.l, got, tt.want)
			}
		})
	}
}

func TestScale(t *testing.T) {
	l := Load{Load1: 5, Cores: 2, Booting: 1}
	if got, want := l.Scale(15*time.Minute), 45*time.Minute; got != want {
		t.Errorf("Scale(15m) at %s = %s, want %s", l, got, want)
	}
	if got, want := (Load{Cores: 8}).Scale(5*time.Minute), 5*time.Minute; got != want {
		t.Errorf("idle Scale(5m) = %s, want %s", got, want)
	}
}

func TestParseLoadavg(t *testing.T) {
	got, err := parseLoadavg("3.52 2.10 1.05 4/812 12345\n")
	if err != nil || got != 3.52 {
		t.Errorf("parseLoadavg = %v, %v; want 3.52", got, err)
	}
	if _, err := parseLoadavg(""); err == nil {
		t.Error("parseLoadavg(\"\") did not fail")
	}
	if l := Read(2); l.Cores < 1 || l.Booting != 2 || l.Load1 < 0 {
		t.Errorf("Read(2) = %+v", l)
	}
}

func TestLoadString(t *testing.T) {
	for l, want := range map[Load]string{
		{Load1: 5.2, Cores: 2}:             "load 5.20 on 2 cores",
		{Load1: 1, Cores: 4, Booting: 1}:   "load 1.00 on 4 cores, 1 other VM booting",
		{Load1: 0.5, Cores: 2, Booting: 3}: "load 0.50 on 2 cores, 3 other VMs booting",
	} {
		if got := l.String(); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

// A Stretch context whose load grows after it is made ends later than the
// base, and its cause names the load it saw.
func TestStretchGrowsWithLoadAndSaysIt(t *testing.T) {
	var reads atomic.Int32
	read := func() Load {
		if reads.Add(1) == 1 {
			return Load{Load1: 0, Cores: 2}
		}
		return Load{Load1: 6, Cores: 2, Booting: 2}
	}
	base := 60 * time.Millisecond
	began := time.Now()
	ctx, cancel := Stretch(context.Background(), base, 10*time.Millisecond, read)
	defer cancel()
	<-ctx.Done()
	waited := time.Since(began)
	var te *TimeoutError
	if !errors.As(context.Cause(ctx), &te) {
		t.Fatalf("cause %v, want a *TimeoutError", context.Cause(ctx))
	}
	if te.Peak.Factor() != MaxFactor || te.Limit != (Load{Load1: 6, Cores: 2, Booting: 2}).Scale(base) {
		t.Errorf("TimeoutError %+v: want the peak load (factor %d) and its limit", te, MaxFactor)
	}
	if waited < te.Limit {
		t.Errorf("ended after %s, before its own limit %s", waited, te.Limit)
	}
	if !errors.Is(te, context.DeadlineExceeded) || !strings.Contains(te.Error(), "load 6.00 on 2 cores, 2 other VMs booting") {
		t.Errorf("error %q: want a deadline error that names the load", te)
	}
}

// Cancelling a Stretch context is not a timeout.
func TestStretchCancel(t *testing.T) {
	ctx, cancel := Stretch(context.Background(), time.Hour, time.Hour, func() Load { return Load{Cores: 1} })
	cancel()
	<-ctx.Done()
	var te *TimeoutError
	if errors.As(context.Cause(ctx), &te) {
		t.Errorf("cancelled context's cause is a timeout: %v", te)
	}
}
