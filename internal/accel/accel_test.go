package accel

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// The probe's detector, exercised with real QEMU under TCG (which works
// everywhere): a real kernel reaches its panic and is recognised.
func TestBootsRecognisesAKernelReachingPanic(t *testing.T) {
	qemu := tu.Program(t, "qemu-system-x86_64")
	kernel := tu.Kernel(t)
	ok, detail := Boots(context.Background(), execx.OS{}, qemu, TCG, kernel, 2*time.Minute)
	if !ok {
		t.Fatalf("a real kernel under TCG was not recognised: %s", detail)
	}
}

func TestBootsRejectsSomethingThatIsNotAKernel(t *testing.T) {
	qemu := tu.Program(t, "qemu-system-x86_64")
	bogus := filepath.Join(t.TempDir(), "vmlinuz")
	os.WriteFile(bogus, []byte(strings.Repeat("not a kernel\n", 1000)), 0o644)
	ok, detail := Boots(context.Background(), execx.OS{}, qemu, TCG, bogus, 30*time.Second)
	if ok || detail == "" {
		t.Errorf("got ok=%v detail=%q, want a failure with a reason", ok, detail)
	}
}

func TestProbeDecidesCachesAndExplains(t *testing.T) {
	qemu := tu.Program(t, "qemu-system-x86_64")
	kernel := tu.Kernel(t)
	cache := filepath.Join(t.TempDir(), "accel.json")
	p := &Prober{Run: execx.OS{}, QEMU: qemu, Kernels: []string{"/nonexistent", kernel}, Cache: cache, Timeout: 5 * time.Second}
	r := p.Probe(context.Background())
	t.Logf("probe: %+v", r)
	switch r.Accel {
	case KVM:
	case TCG:
		if r.Reason == "" || r.Hint == "" {
			t.Errorf("TCG without a reason and a hint: %+v", r)
		}
	default:
		t.Fatalf("accel %q", r.Accel)
	}
	b, err := os.ReadFile(cache)
	if err != nil {
		t.Fatalf("result not cached: %v", err)
	}
	var c Result
	json.Unmarshal(b, &c)
	if c.Accel != r.Accel || !strings.Contains(c.Key, kernel) {
		t.Errorf("cached %+v", c)
	}
	// A cached result is used as is: make it say something the probe
	// would never measure, and see it come back.
	c.Reason = "from the cache"
	b, _ = json.Marshal(c)
	os.WriteFile(cache, b, 0o600)
	if again := p.Probe(context.Background()); again.Reason != "from the cache" {
		t.Errorf("cache not used: %+v", again)
	}
	// A different kernel is a different key: measured again.
	p.Kernels = []string{"/nonexistent-kernel"}
	if again := p.Probe(context.Background()); again.Reason == "from the cache" {
		t.Errorf("stale cache entry used: %+v", again)
	}
}

func TestOverride(t *testing.T) {
	for in, want := range map[string]string{"kvm": KVM, "tcg": TCG, "bogus": TCG} {
		r := (&Prober{Override: in}).Probe(context.Background())
		if r.Accel != want || r.Reason == "" {
			t.Errorf("override %q: %+v", in, r)
		}
	}
}
