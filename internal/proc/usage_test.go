package proc

import (
	"os"
	"testing"
	"time"
)

// This test's own process: resident, so some PSS; busy a moment, so some
// processor time, which grows.
func TestUsage(t *testing.T) {
	pss, err := PSS(os.Getpid())
	if err != nil || pss < 1<<20 {
		t.Fatalf("PSS = %d, %v; want at least 1 MiB", pss, err)
	}
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := CPUTime(os.Getpid())
	if err != nil || after <= before {
		t.Fatalf("CPUTime %s then %s, %v; want it to grow", before, after, err)
	}
	if _, err := PSS(1 << 30); err == nil {
		t.Error("PSS of no process")
	}
}
