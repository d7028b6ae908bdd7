package vm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// suspendResume suspends e's running VM and resumes it (TestNewHost runs
// it on its qemu VM after lifecycle, which saves a boot): a process
// outside /workspace keeps running with its memory, files written in the
// workspace before suspend (from the guest) and during it (on the host) are
// both there, the guest's clock is the host's again, the egress proxy's guestfwd rule
// works again. A process using /workspace makes suspend --save refuse,
// naming it (without --save suspend pauses such a VM in place:
// suspendPausesABusyVM); a tampered saved state is refused and stop
// discards it, leaving the VM stopped.
func suspendResume(t *testing.T, m *vm.Manager, e state.Entry) {
	ctx := context.Background()
	susp := e.Record.Branch
	if _, err := m.Resume(ctx, susp, vm.StartOptions{}); err == nil || !strings.Contains(err.Error(), "is running, not suspended") {
		t.Errorf("resume of a running VM: got %v, want a refusal", err)
	}
	sh := guestSh(t, m, susp)

	// A process in /workspace: suspend --save refuses, naming it, and the
	// VM runs on with its workspace and agent-mcp.
	busy := sh("setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!")
	_, err := m.Suspend(ctx, susp, vm.SuspendOptions{Save: true})
	var be *guestctl.BusyError
	if !errors.As(err, &be) || !strings.Contains(be.Processes, busy+" sleep 1000") || !strings.Contains(err.Error(), "agent-vm sessions "+susp) || !strings.Contains(err.Error(), "`agent-vm suspend "+susp+"` without --save pauses") {
		t.Fatalf("suspend --save with a process in /workspace: got %v, want a refusal naming pid %s and the pause", err, busy)
	}
	if got := sh("mountpoint -q /workspace && systemctl is-active agent-mcp"); got != "active" {
		t.Errorf("after the refused suspend: %q, want /workspace mounted and agent-mcp active", got)
	}
	sh("kill " + busy)

	// A counter outside /workspace, whose count lives only in its memory.
	pid := sh("cd /tmp && setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i >/tmp/count; sleep 0.2; done' </dev/null >/dev/null 2>&1 & echo $!")
	stat := func() string { return sh("cut -d' ' -f22 /proc/" + pid + "/stat") } // its start time
	started := stat()
	bootID := sh("cat /proc/sys/kernel/random/boot_id")
	sh("echo before >/workspace/from-guest && sync")
	// The counter's shell truncates the file before it writes the next
	// count: a read between the two finds it empty, and reads again.
	count := func() int {
		n, _ := strconv.Atoi(sh(`c=$(cat /tmp/count 2>/dev/null); while [ -z "$c" ]; do sleep 0.05; c=$(cat /tmp/count 2>/dev/null); done; echo "$c"`))
		return n
	}
	var before int
	tu.WaitFor(t, "the counter to count", func() bool { before = count(); return before > 1 })
	qemuPid := m.Status(ctx, e, false).Pid

	res, err := m.Suspend(ctx, susp, vm.SuspendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Paused {
		t.Errorf("suspend of a VM whose workspace is free paused it (%s), want it saved", res.Detail)
	}
	t.Logf("suspend took %s", res.Took)
	info := m.Status(ctx, e, false)
	if info.State != vminfo.StateSuspended || info.Suspend != vminfo.SuspendSaved || info.Pid != 0 {
		t.Errorf("after suspend: state %s (%q), pid %d; want suspended, saved, no pid", info.State, info.Suspend, info.Pid)
	}
	// QEMU has exited; this test process, its parent, reaps it a moment
	// later.
	what := fmt.Sprintf("QEMU (pid %d) to end after suspend", qemuPid)
	if err := tu.Poll(tu.Context(t, what), what, func() bool { return syscall.Kill(qemuPid, 0) != nil }); err != nil {
		t.Error(err)
	}
	fi, err := os.Stat(filepath.Join(e.Layout.RunDir(), qemu.StateFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v, want mode 0600", err, fi)
	}
	t.Logf("state file: %d MiB", fi.Size()>>20)
	// Before 8.1, QEMU's x-ignore-shared leaves the guest's RAM (a shared
	// memfd) out of the stream: agent-vm saved its data apart, and the
	// stream is the devices' state, well under the RAM the guest uses.
	var saved struct {
		QEMU     string `json:"qemu"`
		RAMApart bool   `json:"ram_apart"`
	}
	if b, err := os.ReadFile(filepath.Join(e.Layout.RunDir(), qemu.StateMeta)); err != nil || json.Unmarshal(b, &saved) != nil {
		t.Fatalf("the saved state's record: %v", err)
	}
	if strings.HasPrefix(saved.QEMU, "7.") {
		ram, err := os.Stat(filepath.Join(e.Layout.RunDir(), qemu.RAMFile))
		if !saved.RAMApart || err != nil || ram.Mode().Perm() != 0o600 || fi.Size() > 16<<20 {
			t.Errorf("QEMU %s: RAM apart %v, its file %v (%v), the stream %d bytes; want the RAM in its own 0600 file, the stream the devices' state", saved.QEMU, saved.RAMApart, ram, err, fi.Size())
		}
	}
	if err := os.WriteFile(filepath.Join(e.Layout.Workspace(), "from-host"), []byte("while suspended\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Time passing is what is tested here: the guest's clock must be set
	// on resume, not merely continue from where it stopped.
	time.Sleep(5 * time.Second)

	rres, err := m.Start(ctx, susp, vm.StartOptions{})
	if err != nil {
		t.Fatalf("start of a suspended VM: %v", err)
	}
	if !rres.Resumed || rres.Info.State != vminfo.StateRunning {
		t.Errorf("start of a suspended VM: resumed %v, state %s", rres.Resumed, rres.Info.State)
	}
	t.Logf("resume: SSH after %s, agent-mcp after %s", rres.SSHReady, rres.HealthReady)
	// The held connection ended with the saved QEMU; resume holds a new one.
	tu.WaitFor(t, "a holder after resume", func() bool { return m.Status(context.Background(), e, false).SSH.Held != "" })
	if got := sh("cat /proc/sys/kernel/random/boot_id"); got != bootID {
		t.Errorf("boot id %s, was %s: the guest booted again", got, bootID)
	}
	if got := stat(); got != started {
		t.Errorf("process %s started at %s, was %s", pid, got, started)
	}
	// The counter kept its count, and counts on.
	resumed := count()
	if resumed < before {
		t.Errorf("the counter is at %d, was %d before suspend: it lost its memory", resumed, before)
	}
	tu.WaitFor(t, fmt.Sprintf("the counter to count on from %d", resumed), func() bool { return count() > resumed })
	if got := sh("cat /workspace/from-guest /workspace/from-host"); got != "before\nwhile suspended" {
		t.Errorf("workspace after resume: %q", got)
	}
	sh("echo after >/workspace/after-resume")
	if b, _ := os.ReadFile(filepath.Join(e.Layout.Workspace(), "after-resume")); string(b) != "after\n" {
		t.Errorf("a file the guest wrote after resume reads %q on the host", b)
	}
	// The guest's time must fall between the host's time before the
	// command went out and after its answer came back (a busy host's SSH
	// round trip takes seconds), give or take 3 s (date +%s truncates).
	asked := time.Now()
	guestNow, _ := strconv.ParseInt(sh("date +%s"), 10, 64)
	answered := time.Now()
	if g := time.Unix(guestNow, 0); g.Before(asked.Add(-3*time.Second)) || g.After(answered.Add(3*time.Second)) {
		t.Errorf("the guest's clock reads %s after resume; the host's was %s to %s", g.UTC().Format(time.RFC3339), asked.UTC().Format(time.RFC3339), answered.UTC().Format(time.RFC3339))
	}
	if code, out, _ := run(t, m, susp, "curl", "-sS", "--max-time", "30", "http://not-allowed.test/"); code != 0 || !strings.Contains(out, "not on the allow-list") {
		t.Errorf("the egress proxy after resume: exit %d, %q", code, out)
	}
	if got := sh("systemctl is-active agent-mcp"); got != "active" {
		t.Errorf("agent-mcp after resume: %s", got)
	}

	// A saved state whose recorded QEMU version is not this QEMU's is
	// refused, kept, and discarded by stop.
	if _, err := m.Suspend(ctx, susp, vm.SuspendOptions{Save: true}); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(e.Layout.RunDir(), qemu.StateMeta)
	b, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	rec["qemu"] = "1.0.0"
	b, _ = json.Marshal(rec)
	if err := os.WriteFile(meta, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = m.Start(ctx, susp, vm.StartOptions{})
	if !errors.Is(err, driver.ErrStaleState) || !strings.Contains(err.Error(), "QEMU 1.0.0") || !strings.Contains(err.Error(), "agent-vm start --cold") {
		t.Errorf("start with a tampered state: got %v, want a refusal naming the version and the way out", err)
	}
	if st := m.Status(ctx, e, false).State; st != vminfo.StateSuspended {
		t.Errorf("after the refused resume: %s, want suspended", st)
	}
	sres, err := m.Stop(ctx, susp)
	if err != nil || sres.Was != vminfo.StateSuspended {
		t.Fatalf("stop of a suspended VM: %+v, %v", sres, err)
	}
	for _, f := range []string{qemu.StateFile, qemu.RAMFile} {
		if _, err := os.Stat(filepath.Join(e.Layout.RunDir(), f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stop kept the saved state's %s: %v", f, err)
		}
	}
	if st := m.Status(ctx, e, false).State; st != vminfo.StateStopped {
		t.Errorf("after stop: %s, want stopped", st)
	}
}
