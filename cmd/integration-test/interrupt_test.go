package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
)

// interruptCase is a run interrupted with SIGINT when a line matching
// trigger appears (plus delay): it must exit 130 and leave nothing behind.
type interruptCase struct {
	name    string
	run     string        // --run
	trigger string        // a verbose "$ agent-vm ..." line
	delay   time.Duration // after the trigger, before SIGINT
	vm      bool          // needs a host that boots VMs
}

func TestInterruptCleansUp(t *testing.T) {
	for _, c := range []interruptCase{
		// SIGINT while `agent-vm create` runs: forwarded to it, then cleanup.
		{name: "cli", run: "^cli$", trigger: "$ agent-vm create itest/cli"},
		// SIGINT mid-boot, at the first progress line of the run's
		// template build (15 s into its cold boot, after agent-vm's
		// accelerator probe, with QEMU running): agent-vm stops the
		// template's VM and keeps nothing of it; no QEMU or virtiofsd may
		// survive, no temp dir may remain. (A scenario's own start comes
		// after the template, once it is built: minutes.)
		{name: "mid-boot", run: "^template$", trigger: "… building the run's template", vm: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.vm {
				requireVMs(t)
			} else {
				requireCreate(t)
			}
			testInterrupt(t, c)
		})
	}
}

func testInterrupt(t *testing.T, c interruptCase) {
	tmp := t.TempDir()
	cmd := exec.Command(testBins.itest, "--agent-vm", testBins.agentVM, "--run", c.run, "--verbose")
	cmd.Env = itestEnv(tmp)
	cmd.Dir = tmp
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		sc := bufio.NewScanner(io.TeeReader(stdout, &out))
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), c.trigger) {
				signalled = true
				time.AfterFunc(c.delay, func() { _ = cmd.Process.Signal(os.Interrupt) })
			}
		}
	}()
	done := make(chan error, 1)
	go func() { <-sent; done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("integration-test did not end within 10 minutes of starting:\n%s", out.String())
	}
	r := itestRun{stdout: out.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode(), tmp: tmp}
	if !strings.Contains(r.stdout, c.trigger) {
		r.dump(t)
		t.Fatalf("the run never printed %q, so it was not interrupted where intended", c.trigger)
	}
	if r.code != harness.ExitInterrupted {
		r.dump(t)
		t.Fatalf("exit status %d, want %d", r.code, harness.ExitInterrupted)
	}
	if !strings.Contains(r.stdout, "interrupted:") {
		t.Errorf("the output does not say the run was interrupted")
	}
	if left := r.leftovers(t); len(left) > 0 {
		r.dump(t)
		t.Errorf("the interrupted run left %q in its TMPDIR", left)
	}
	if ps := harness.ProcessesMentioning(tmp); len(ps) > 0 {
		for _, p := range ps {
			_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		}
		r.dump(t)
		t.Errorf("processes survived the interrupted run: %+v", ps)
	}
}

// requireVMs skips (strict: fails) unless agent-vm says this host can boot
// VMs (`agent-vm doctor --json`: vm_ready).
func requireVMs(t *testing.T) {
	t.Helper()
	out, err := exec.Command(testBins.agentVM, "doctor", "--json").Output()
	var d struct {
		VMReady bool `json:"vm_ready"`
	}
	if jerr := json.Unmarshal(out, &d); jerr != nil {
		blackbox.SkipOrFail(t, "agent-vm doctor --json gives no report (%v; %v), so whether VMs boot here is unknown", err, jerr)
	}
	if !d.VMReady {
		blackbox.SkipOrFail(t, "agent-vm doctor says VMs cannot boot here (hint: run `%s doctor` for why)", testBins.agentVM)
	}
}
