package vm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/forward"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/guestctl"
	"github.com/agent-vm/agent-vm/internal/hold"
	"github.com/agent-vm/agent-vm/internal/idle"
	"github.com/agent-vm/agent-vm/internal/proc"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/qmp"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// pauseAgent is the agent of suspendPausesABusyVM's session: it runs
// in /workspace (the session's directory), writes its pid there and counts
// in /tmp, every 0.2 s, for as long as it runs.
const pauseAgent = `echo $$ > .agent-pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/agent-count; sleep 0.2; done`

// An agent at work in /workspace (an agent-vm session, started as `run`
// starts one) does not stop a suspend: suspend pauses the VM in place
// instead of saving it, and says why. While paused: QEMU says so, its
// process uses no CPU, status says suspended (paused), its pid, and no
// unhealthy agent; exec refuses with resume's hint; a file the host
// writes in the workspace waits. resume continues the same QEMU: the
// agent's process (same pid, cwd /workspace) counts on, its session is
// there, the host's file is seen, the guest's clock is the host's.
// suspend --save refuses, naming the agent and the pause; --pause and
// start work as suspend and resume do; stop of a paused VM shuts its guest
// down cleanly. It runs on a running VM of TestTemplate's, whose boot
// it shares (a boot of its own cost two minutes of CI's under TCG).
func suspendPausesABusyVM(t *testing.T, m *vm.Manager, e state.Entry) {
	ctx := context.Background()
	b := e.Record.Branch
	sh := guestSh(t, m, b)
	cmd, stdin, err := session.Start(session.Spec{Name: "agent", Argv: []string{"sh", "-c", pauseAgent}})
	if err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if code, err := m.Exec(ctx, b, []string{"sh", "-c", cmd}, bytes.NewReader(stdin), &out, &errs); err != nil || code != 0 {
		t.Fatalf("starting the session: exit %d, %v: %s", code, err, errs.String())
	}
	pidFile := filepath.Join(e.Layout.Workspace(), ".agent-pid")
	tu.WaitFor(t, "the agent's pid file", func() bool { b, _ := os.ReadFile(pidFile); return bytes.HasSuffix(b, []byte("\n")) })
	raw, _ := os.ReadFile(pidFile)
	agent := strings.TrimSpace(string(raw))
	if got := sh("readlink /proc/" + agent + "/cwd"); got != "/workspace" {
		t.Fatalf("the agent runs in %q, want /workspace", got)
	}
	bootID := sh("cat /proc/sys/kernel/random/boot_id")

	// --save refuses, naming the agent and the pause; nothing changes.
	_, err = m.Suspend(ctx, b, vm.SuspendOptions{Save: true})
	var be *guestctl.BusyError
	if !errors.As(err, &be) || !strings.Contains(be.Processes, agent+" ") || !strings.Contains(err.Error(), "`agent-vm suspend "+b+"` without --save pauses") {
		t.Fatalf("suspend --save with an agent in /workspace: got %v, want a refusal naming pid %s and the pause", err, agent)
	}
	if st := m.Status(ctx, e, false).State; st != vminfo.StateRunning {
		t.Fatalf("after the refused suspend --save: %s", st)
	}

	qemuPid := m.Status(ctx, e, false).Pid
	runningTicks := cpuTicks(t, qemuPid, 3*time.Second)
	before := sh("cat /tmp/agent-count")
	res, err := m.Suspend(ctx, b, vm.SuspendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("paused in %s: %s", res.Took, res.Detail)
	if !res.Paused || !strings.Contains(res.Busy, agent+" ") || res.HostRAM <= 0 {
		t.Errorf("suspend of a busy VM: %+v; want it paused in place because of pid %s, naming the host RAM its QEMU holds", res, agent)
	}
	if got := qmpStatus(t, e); got != "paused" {
		t.Errorf("QEMU's status after the pause: %q, want paused", got)
	}
	info := m.Status(ctx, e, true)
	if info.State != vminfo.StateSuspended || info.Suspend != vminfo.SuspendPaused || info.Pid != qemuPid || info.Agent.State == "unhealthy" || info.SSH.Held != "" {
		t.Errorf("status of the paused VM: state %s (%q), pid %d (QEMU's is %d), agent %+v, held %q", info.State, info.Suspend, info.Pid, qemuPid, info.Agent, info.SSH.Held)
	}
	// CPU time, not wall time: the host's load does not count. An idle
	// TCG guest's timers keep its QEMU busy; a paused one has none.
	pausedTicks := cpuTicks(t, qemuPid, 3*time.Second)
	t.Logf("QEMU's CPU time over 3 s: %d ticks running (idle), %d paused", runningTicks, pausedTicks)
	if pausedTicks > 20 {
		t.Errorf("the paused QEMU used %d ticks of CPU in 3 s (running idle: %d), want next to none", pausedTicks, runningTicks)
	}
	if _, err := m.Exec(ctx, b, []string{"true"}, nil, &out, &errs); err == nil || !strings.Contains(err.Error(), "agent-vm resume "+b) {
		t.Errorf("exec on a paused VM: %v, want a refusal naming resume", err)
	}
	if err := os.WriteFile(filepath.Join(e.Layout.Workspace(), "from-host"), []byte("while paused\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	rres, err := m.Resume(ctx, b, vm.StartOptions{})
	if err != nil {
		t.Fatalf("resume of a paused VM: %v", err)
	}
	t.Logf("resume: SSH after %s, agent-mcp after %s", rres.SSHReady, rres.HealthReady)
	if !rres.Resumed || rres.Info.State != vminfo.StateRunning || rres.Info.Pid != qemuPid || rres.Info.Agent.State != "healthy" {
		t.Errorf("resume of a paused VM: resumed %v, state %s, pid %d (was %d), agent %+v", rres.Resumed, rres.Info.State, rres.Info.Pid, qemuPid, rres.Info.Agent)
	}
	tu.WaitFor(t, "a holder after resume", func() bool { return m.Status(context.Background(), e, false).SSH.Held != "" })
	checkAgentGoesOn(t, sh, agent, bootID, before)
	if got := sh("cat /workspace/from-host"); got != "while paused" {
		t.Errorf("the host's file written during the pause reads %q in the guest", got)
	}
	asked := time.Now()
	guestNow, _ := strconv.ParseInt(sh("date +%s"), 10, 64)
	if g := time.Unix(guestNow, 0); g.Before(asked.Add(-3*time.Second)) || g.After(time.Now().Add(3*time.Second)) {
		t.Errorf("the guest's clock reads %s after resume; the host's was %s", g.UTC().Format(time.RFC3339), asked.UTC().Format(time.RFC3339))
	}
	sessions, err := session.Parse(sh(session.List()), time.Now())
	if s, ok := session.Find(sessions, "agent"); err != nil || !ok || s.Exited {
		t.Errorf("the agent's session after resume: %+v (%v)", sessions, err)
	}

	// --pause, then start continues it as resume does.
	before = sh("cat /tmp/agent-count")
	if res, err := m.Suspend(ctx, b, vm.SuspendOptions{Pause: true}); err != nil || !res.Paused || res.Busy != "" {
		t.Fatalf("suspend --pause: %+v, %v", res, err)
	}
	if sres, err := m.Start(ctx, b, vm.StartOptions{}); err != nil || !sres.Resumed || sres.Info.Pid != qemuPid {
		t.Fatalf("start of a paused VM: %+v, %v", sres, err)
	}
	checkAgentGoesOn(t, sh, agent, bootID, before)

	hibernateAndWake(t, m, e, sh, agent, bootID, qemuPid)

	// Stop continues the paused guest, which powers off cleanly.
	if _, err := m.Suspend(ctx, b, vm.SuspendOptions{}); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	sres, err := m.Stop(ctx, b)
	if err != nil || sres.Was != vminfo.StateSuspended || sres.Suspend != vminfo.SuspendPaused {
		t.Fatalf("stop of a paused VM: %+v, %v", sres, err)
	}
	t.Logf("stop of the paused VM took %s", time.Since(stopped))
	if info := m.Status(ctx, e, false); info.State != vminfo.StateStopped || info.Pid != 0 {
		t.Errorf("after stop: %s, pid %d", info.State, info.Pid)
	}
	if tail := driver.TailFile(e.Layout.Log(qemu.ConsoleLog), 5); !strings.Contains(tail, driver.PowerOffMarker) {
		t.Errorf("the paused guest did not power off cleanly; its console ends:\n%s", tail)
	}
	if _, err := os.Stat(filepath.Join(e.Layout.RunDir(), qemu.PauseFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stop left the pause mark: %v", err)
	}
}

// hibernateAndWake hibernates the VM whose agent works in /workspace: its
// QEMU gives the guest's memory back (its PSS drops) and its holder stays;
// exec wakes it, and so does a request to its MCP port on a connection
// kept from before (through the holder's watch, which runs `agent-vm
// resume`); the agent goes on each time.
func hibernateAndWake(t *testing.T, m *vm.Manager, e state.Entry, sh func(string) string, agent, bootID string, qemuPid int) {
	ctx := context.Background()
	b := e.Record.Branch
	pss, _ := proc.PSS(qemuPid)
	before := sh("cat /tmp/agent-count")
	res, err := m.Suspend(ctx, b, vm.SuspendOptions{Hibernate: true})
	if err != nil || res.Suspend != vminfo.SuspendHibernated || !res.Paused {
		t.Fatalf("suspend --hibernate: %+v, %v", res, err)
	}
	asleep, _ := proc.PSS(qemuPid)
	t.Logf("hibernated in %s: QEMU's PSS %d MiB before, %d MiB after (%s)", res.Took, pss>>20, asleep>>20, res.Detail)
	if asleep > pss-100<<20 {
		t.Errorf("the hibernated QEMU's PSS is %d MiB, was %d MiB: the guest's memory stayed", asleep>>20, pss>>20)
	}
	info := m.Status(ctx, e, false)
	if info.State != vminfo.StateSuspended || info.Suspend != vminfo.SuspendHibernated || info.Pid != qemuPid {
		t.Errorf("status of the hibernated VM: %s (%q), pid %d (was %d)", info.State, info.Suspend, info.Pid, qemuPid)
	}
	woke := time.Now()
	var out, errs bytes.Buffer
	if code, err := m.Exec(ctx, b, []string{"cat", "/tmp/agent-count"}, nil, &out, &errs); err != nil || code != 0 {
		t.Fatalf("exec on a hibernated VM: exit %d, %v: %s", code, err, errs.String())
	}
	t.Logf("exec woke the VM and ran in %s", time.Since(woke))
	if info := m.Status(ctx, e, false); info.State != vminfo.StateRunning || info.Pid != qemuPid {
		t.Errorf("after exec woke it: %s, pid %d", info.State, info.Pid)
	}
	checkAgentGoesOn(t, sh, agent, bootID, before)

	// A request on a connection made before the hibernation (an HTTP
	// client's kept-alive one, as an MCP client's) wakes it, as one on a new
	// connection does; the integration's sessions scenario makes the new one.
	c := http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
	url := fmt.Sprintf("http://127.0.0.1:%d%s", e.Record.Ports.MCP, guest.HealthPath)
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	before = sh("cat /tmp/agent-count")
	if _, err := m.Suspend(ctx, b, vm.SuspendOptions{Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	woke = time.Now()
	resp, err = c.Get(url)
	if err != nil {
		t.Fatalf("a request to the hibernated VM's MCP port: %v\nthe holder's log:\n%s\nthe resume's:\n%s", err, driver.TailFile(e.Layout.Log(hold.LogName), 10), driver.TailFile(e.Layout.Log(idle.SuspendLog), 5))
	}
	resp.Body.Close()
	t.Logf("a request on a kept connection to its MCP port woke the VM and was answered (%s) in %s", resp.Status, time.Since(woke))
	tu.WaitFor(t, "the VM running after the request", func() bool { return m.Status(ctx, e, false).State == vminfo.StateRunning })
	checkAgentGoesOn(t, sh, agent, bootID, before)

	// A forward added while the VM runs (its holder started long before)
	// wakes it too: a request to a server in the guest on it.
	sh("setsid python3 -m http.server 8123 --bind 0.0.0.0 --directory /tmp >/dev/null 2>&1 < /dev/null &")
	ch, err := forward.Add(ctx, m, b, 8123, 0, m.Log)
	if err != nil {
		t.Fatal(err)
	}
	served := fmt.Sprintf("http://127.0.0.1:%d/agent-count", ch.Forward.Host)
	tu.WaitFor(t, "the guest's server on the new forward", func() bool {
		resp, err := c.Get(served)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	if _, err := m.Suspend(ctx, b, vm.SuspendOptions{Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	woke = time.Now()
	resp, err = (&http.Client{Timeout: time.Minute, Transport: &http.Transport{}}).Get(served)
	if err != nil {
		t.Fatalf("a request to the hibernated VM's new forward: %v\nthe holder's log:\n%s", err, driver.TailFile(e.Layout.Log(hold.LogName), 10))
	}
	resp.Body.Close()
	t.Logf("a request to a forward added while it ran woke the VM and was answered (%s) in %s", resp.Status, time.Since(woke))
	tu.WaitFor(t, "the VM running after the request", func() bool { return m.Status(ctx, e, false).State == vminfo.StateRunning })
	// A command's wake that finds it woken meanwhile (by its holder, for a
	// connection) goes on; a plain resume is refused.
	if res, err := m.Resume(ctx, b, vm.StartOptions{Wake: true}); err != nil || !res.AlreadyRunning {
		t.Errorf("a wake of the VM woken meanwhile: %+v, %v; want it running already, no error", res, err)
	}
}

// checkAgentGoesOn checks that the agent's process is the one from before
// (the same boot, pid, cwd) and counts on from before.
func checkAgentGoesOn(t *testing.T, sh func(string) string, agent, bootID, before string) {
	t.Helper()
	if got := sh("cat /proc/sys/kernel/random/boot_id"); got != bootID {
		t.Errorf("boot id %s, was %s: the guest booted again", got, bootID)
	}
	if got := sh("readlink /proc/" + agent + "/cwd"); got != "/workspace" {
		t.Errorf("the agent (pid %s) runs in %q, want /workspace", agent, got)
	}
	n0, _ := strconv.Atoi(before)
	tu.WaitFor(t, "the agent counting on from "+before, func() bool { n, _ := strconv.Atoi(sh("cat /tmp/agent-count")); return n > n0 })
}

// qmpStatus asks the VM's QEMU for its run state (query-status).
func qmpStatus(t *testing.T, e state.Entry) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := qmp.Dial(ctx, filepath.Join(qemu.SocketDirFor(e.Layout.RunDir(), e.Record.ID), qemu.QMPSocket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// cpuTicks is the CPU time (user and system, in clock ticks) process pid
// used over d.
func cpuTicks(t *testing.T, pid int, d time.Duration) int {
	t.Helper()
	read := func() int {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:])) // after the command name
		utime, _ := strconv.Atoi(f[11])                                // field 14 of stat
		stime, _ := strconv.Atoi(f[12])                                // field 15
		return utime + stime
	}
	first := read()
	time.Sleep(d) // the interval measured over, not a wait for anything
	return read() - first
}
