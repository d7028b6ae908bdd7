package accel

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/hostdir"
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

// The real probe on this machine, with real QEMU and a real kernel. The
// machines this runs on differ (no /dev/kvm; /dev/kvm whose guest hangs;
// /dev/kvm where QEMU aborts; working KVM), so what is checked follows what
// this machine has: every case gives a decision with a reason, and a
// measured decision is cached and reused.
func TestProbeOnThisMachine(t *testing.T) {
	qemu := tu.Program(t, "qemu-system-x86_64")
	kernel := tu.Kernel(t)
	dir := hostdir.Top(filepath.Join(t.TempDir(), "cache"), 0o711, hostdir.InXDG)
	cache := filepath.Join(dir.Path, CacheFile)
	p := &Prober{Run: execx.OS{}, QEMU: qemu, Kernels: []string{"/nonexistent", kernel}, CacheDir: dir, Timeout: 5 * time.Second}
	r := p.Probe(context.Background())
	t.Logf("this machine: %+v", r)
	checkDecision(t, r)
	if _, err := os.Stat("/dev/kvm"); errors.Is(err, os.ErrNotExist) {
		if !strings.Contains(r.Reason, "does not exist") {
			t.Errorf("no /dev/kvm here, but the reason is %q", r.Reason)
		}
		if _, err := os.Stat(cache); err == nil {
			t.Errorf("a missing device was cached; it is checked on every probe")
		}
		return
	}
	if r.Accel == TCG && !strings.Contains(r.Reason, "present") && !strings.Contains(r.Reason, "permission") {
		t.Errorf("/dev/kvm exists, so TCG must say why KVM failed: %q", r.Reason)
	}
	checkCached(t, p, cache, r, kernel)
}

// checkDecision: a decision is KVM, or TCG with a reason and a hint.
func checkDecision(t *testing.T, r Result) {
	t.Helper()
	switch r.Accel {
	case KVM:
	case TCG:
		if r.Reason == "" || r.Hint == "" {
			t.Errorf("TCG without a reason and a hint: %+v", r)
		}
	default:
		t.Fatalf("accel %q", r.Accel)
	}
}

// checkCached: the result is in the cache file, in a directory with the
// mode the caller gave it (not the probe's own), a cached result is used as
// it is, and another kernel is another key.
func checkCached(t *testing.T, p *Prober, cache string, r Result, kernel string) {
	t.Helper()
	b, err := os.ReadFile(cache)
	if err != nil {
		t.Fatalf("result not cached: %v", err)
	}
	if fi, err := os.Stat(p.CacheDir.Path); err != nil || fi.Mode().Perm() != p.CacheDir.Mode {
		t.Errorf("cache directory %v %v, want %04o", fi.Mode(), err, p.CacheDir.Mode)
	}
	var c Result
	json.Unmarshal(b, &c)
	if c.Accel != r.Accel || !strings.Contains(c.Key, kernel) {
		t.Errorf("cached %+v", c)
	}
	c.Reason = "from the cache"
	b, _ = json.Marshal(c)
	os.WriteFile(cache, b, 0o600)
	if again := p.Probe(context.Background()); again.Reason != "from the cache" {
		t.Errorf("cache not used: %+v", again)
	}
	p.Kernels = []string{"/nonexistent-kernel"}
	if again := p.Probe(context.Background()); again.Reason == "from the cache" {
		t.Errorf("stale cache entry used: %+v", again)
	}
}

// The KVM cases the machines show, each made here whatever this machine
// has: the device node is a path the test controls, and QEMU is a FAKE at
// the exec boundary (execxtest) that behaves as the real one was seen to.
func TestProbeKVMCasesSimulated(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	os.WriteFile(kernel, []byte("kernel"), 0o644)
	present := filepath.Join(t.TempDir(), "kvm") // stands in for a /dev/kvm that opens
	os.WriteFile(present, nil, 0o600)
	serialOf := func(c execxtest.Call) string {
		for i, a := range c.Args {
			if a == "-serial" {
				return strings.TrimPrefix(c.Args[i+1], "file:")
			}
		}
		t.Fatalf("no -serial in %q", c.Args)
		return ""
	}
	cases := []struct {
		name, device string
		qemu         execxtest.Handler // nil: QEMU must not run
		accel, why   string
		cached       bool
	}{
		{name: "no /dev/kvm", device: filepath.Join(t.TempDir(), "absent"), accel: TCG, why: "does not exist"},
		{name: "guest hangs", device: present, accel: TCG, why: "no progress in 200ms", cached: true,
			qemu: func(execxtest.Call) execxtest.Reply { time.Sleep(400 * time.Millisecond); return execxtest.Reply{} }}, // the hang under test, past the probe's 200ms
		{name: "QEMU aborts", device: present, accel: TCG, why: "kvm_buf_set_msrs: Assertion", cached: true,
			qemu: func(execxtest.Call) execxtest.Reply {
				return execxtest.Reply{ExitCode: 134, Stderr: "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69\n" +
					"qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion `ret == cpu->kvm_msr_buf->nmsrs' failed."}
			}},
		{name: "KVM works", device: present, accel: KVM, why: "booted under KVM", cached: true,
			qemu: func(c execxtest.Call) execxtest.Reply {
				os.WriteFile(serialOf(c), []byte("[    0.9] Kernel panic - not syncing: VFS: Unable to mount root fs\n"), 0o644)
				return execxtest.Reply{}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := execxtest.New(t)
			if tc.qemu != nil {
				f.On("qemu-system-x86_64", tc.qemu)
			}
			dir := hostdir.Top(filepath.Join(t.TempDir(), "cache"), 0o711, hostdir.InXDG)
			cache := filepath.Join(dir.Path, CacheFile)
			p := &Prober{Run: f, QEMU: "qemu-system-x86_64", Kernels: []string{kernel}, CacheDir: dir, Timeout: 200 * time.Millisecond, Device: tc.device}
			r := p.Probe(context.Background())
			checkDecision(t, r)
			if r.Accel != tc.accel || !strings.Contains(r.Reason, tc.why) {
				t.Errorf("got %+v, want %s because %q", r, tc.accel, tc.why)
			}
			if tc.cached {
				checkCached(t, p, cache, r, kernel)
			} else if _, err := os.Stat(cache); err == nil {
				t.Errorf("cached, but a device check is made on every probe")
			}
		})
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

// The module is the CPU vendor's; a CPU of another vendor, or none (arm64
// has no vendor_id), names none, and the hints then fit either.
func TestKVMModule(t *testing.T) {
	for _, c := range []struct{ cpuinfo, module, name string }{
		{"processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n", "kvm_intel", "kvm_intel"},
		{"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t: svm GenuineIntel-lookalike\n", "kvm_amd", "kvm_amd"},
		{"processor\t: 0\nvendor_id\t: AuthenticAMD\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n", "kvm_amd", "kvm_amd"},
		{"processor\t: 0\nvendor_id\t: HygonGenuine\n", "", "kvm_intel or kvm_amd"},
		{"processor\t: 0\nCPU implementer\t: 0x41\nCPU architecture: 8\n", "", "kvm_intel or kvm_amd"},
		{"", "", "kvm_intel or kvm_amd"},
	} {
		if m, n := KVMModule(c.cpuinfo), KVMModuleName(c.cpuinfo); m != c.module || n != c.name {
			t.Errorf("%q: module %q, name %q; want %q, %q", c.cpuinfo, m, n, c.module, c.name)
		}
	}
	if _, err := os.Stat("/etc/NIXOS"); err == nil {
		// Skip, not SkipOrFail: nothing is missing here; a NixOS host is
		// told other hints, which are not this test's.
		t.Skip("the hints below are those of a host that is not NixOS")
	}
	for cpuinfo, want := range map[string]string{
		"vendor_id : GenuineIntel\n": "`echo 'options kvm_intel nested=1' | sudo tee /etc/modprobe.d/kvm-nested.conf`, reload kvm_intel",
		"vendor_id : AuthenticAMD\n": "`echo 'options kvm_amd nested=1' | sudo tee /etc/modprobe.d/kvm-nested.conf`, reload kvm_amd",
		"":                           "the nested=1 option of this CPU's KVM module, kvm_intel or kvm_amd",
	} {
		if got := nestedHint(cpuinfo); !strings.Contains(got, want) {
			t.Errorf("%q: %q, want it to say %q", cpuinfo, got, want)
		}
	}
}

func TestKernelCmdlineAddsTCGsParamsUnderTCGOnly(t *testing.T) {
	for _, c := range []struct{ accel, in, want string }{
		{TCG, "root=/dev/vda", "root=/dev/vda norandmaps"},
		{TCG, "", "norandmaps"},
		{KVM, "root=/dev/vda", "root=/dev/vda"},
		{KVM, "", ""},
	} {
		if got := KernelCmdline(c.accel, c.in); got != c.want {
			t.Errorf("KernelCmdline(%q, %q) = %q, want %q", c.accel, c.in, got, c.want)
		}
	}
}
