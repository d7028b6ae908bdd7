package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/bench/report"
	"github.com/agent-vm/agent-vm/blackbox"
)

// runHarness runs the harness as `go run ./bench ARGS -out DIR` would,
// with its temp files under a directory of the test's, and returns the
// result it wrote. It checks the run left nothing behind: no temp
// directory, no process naming one.
func runHarness(t *testing.T, args ...string) *report.Result {
	t.Helper()
	for _, p := range []string{"go", "git"} {
		_, err := exec.LookPath(p)
		blackbox.Need(t, err == nil, p+" is not installed")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	out := filepath.Join(tmp, "results")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append(args, "-out", out), &stdout, &stderr)
	if code != 0 {
		t.Fatalf("harness exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	files, _ := filepath.Glob(filepath.Join(out, "*.json"))
	if len(files) != 1 {
		t.Fatalf("results dir holds %v, want one JSON file; stderr:\n%s", files, stderr.String())
	}
	if md := strings.TrimSuffix(files[0], ".json") + ".md"; !fileExists(md) {
		t.Errorf("no markdown next to %s", files[0])
	}
	res, err := report.Read(files[0])
	if err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "agent-vm-bench-*"))
	if len(left) > 0 {
		t.Errorf("the run left its lab behind: %v", left)
	}
	for _, p := range blackbox.Processes() {
		if p.Mentions(tmp) {
			t.Errorf("pid %d still runs with the test's temp dir: %s", p.Pid, p.CommandLine())
		}
	}
	return res
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// figure finds a figure of a result.
func figure(t *testing.T, r *report.Result, id string) *report.Figure {
	t.Helper()
	for _, f := range r.Figures {
		if f.ID == id {
			return f
		}
	}
	t.Fatalf("result has no figure %s", id)
	return nil
}

// checkRow checks a row has n samples on both sides and a positive ratio.
func checkRow(t *testing.T, f *report.Figure, id string, n int) {
	t.Helper()
	for _, r := range f.Rows {
		if r.ID != id {
			continue
		}
		if r.Subject.Summary.N != n || r.Reference == nil || r.Reference.Summary.N != n {
			t.Errorf("%s: %d subject and %v reference samples, want %d each", id, r.Subject.Summary.N, r.Reference, n)
		}
		if !(r.Ratio.Median > 0) {
			t.Errorf("%s: ratio %v, want > 0", id, r.Ratio.Median)
		}
		return
	}
	t.Errorf("figure %s has no row %s (rows: %d, errors: %v)", f.ID, id, len(f.Rows), f.Errors)
}

// TestCheapFiguresRun is a real run of the figures that boot nothing: it
// builds agent-vm, creates records, times status and list, writes the
// files and cleans up.
func TestCheapFiguresRun(t *testing.T) {
	res := runHarness(t, "-only", "^(P4|P5|P1)$", "-no-boot", "-n", "2", "-records", "2", "-tree", filepath.Join(runtimeGOROOT(t), "src", "encoding"))
	if res.Commit == "" || res.Machine.Cores == 0 || res.Machine.Kernel == "" {
		t.Errorf("commit %q, machine %+v: want them recorded", res.Commit, res.Machine)
	}
	if len(res.Figures) != 3 {
		t.Fatalf("%d figures, want P5, P1 (skipped) and P4", len(res.Figures))
	}
	p5 := figure(t, res, "P5")
	checkRow(t, p5, "P5.list", 2)
	checkRow(t, p5, "P5.list-floor", 2)
	checkRow(t, p5, "P5.create", 2)
	checkRow(t, figure(t, res, "P4"), "P4.stopped", 2)
	if p1 := figure(t, res, "P1"); p1.Skipped != "-no-boot" || len(p1.Rows) != 0 {
		t.Errorf("P1 under -no-boot: skipped %q with %d rows, want skipped", p1.Skipped, len(p1.Rows))
	}
	for _, f := range res.Figures {
		if len(f.Errors) > 0 {
			t.Errorf("%s: %v", f.ID, f.Errors)
		}
	}
}

// TestBootFiguresRun boots one VM for real and measures P3 and P4 on it.
func TestBootFiguresRun(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM (minutes under TCG); not with -short")
	}
	_, err := exec.LookPath("qemu-system-x86_64")
	blackbox.Need(t, err == nil, "qemu-system-x86_64 is not installed (Debian package qemu-system-x86)")
	res := runHarness(t, "-only", "^(P3|P4)$", "-n", "2", "-tree", filepath.Join(runtimeGOROOT(t), "src", "encoding"))
	p3 := figure(t, res, "P3")
	blackbox.Need(t, p3.Skipped == "", "VMs cannot boot here: "+p3.Skipped)
	checkRow(t, p3, "P3.exec", 2)
	checkRow(t, p3, "P3.floor", 2)
	checkRow(t, p3, "P3.over-floor", 2)
	checkRow(t, figure(t, res, "P4"), "P4.running", 2)
	if res.Machine.Accel == "" || res.Machine.QEMU == "" || res.Machine.Image.Name == "" {
		t.Errorf("machine %+v: want accel, QEMU and image recorded", res.Machine)
	}
}

func runtimeGOROOT(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestInterruptMidBoot cancels a run while a VM boots, as Ctrl-C does: the
// harness exits 130, writes no results and leaves no VM, QEMU, virtiofsd
// or temp directory behind.
func TestInterruptMidBoot(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM; not with -short")
	}
	_, err := exec.LookPath("qemu-system-x86_64")
	blackbox.Need(t, err == nil, "qemu-system-x86_64 is not installed (Debian package qemu-system-x86)")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	out := filepath.Join(tmp, "results")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr lockedBuffer
	stderr.onLine = func(line string) {
		if strings.Contains(line, "starting bench-vm-") {
			go func() { time.Sleep(15 * time.Second); cancel() }()
		}
	}
	code := run(ctx, []string{"-only", "^P3$", "-n", "1", "-out", out, "-tree", filepath.Join(runtimeGOROOT(t), "src", "encoding")}, io.Discard, &stderr)
	if strings.Contains(stderr.String(), "P3: skipped") {
		blackbox.Need(t, false, "VMs cannot boot here")
	}
	if code != 130 {
		t.Errorf("exit code %d after an interrupt, want 130\n%s", code, stderr.String())
	}
	if files, _ := filepath.Glob(filepath.Join(out, "*")); len(files) > 0 {
		t.Errorf("an interrupted run wrote results: %v", files)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "agent-vm-bench-*")); len(left) > 0 {
		t.Errorf("the interrupted run left its lab behind: %v\n%s", left, stderr.String())
	}
	for _, p := range blackbox.Processes() {
		if p.Mentions(tmp) {
			t.Errorf("pid %d still runs with the test's temp dir: %s", p.Pid, p.CommandLine())
		}
	}
}

// lockedBuffer collects the harness's log and hands each line to onLine.
type lockedBuffer struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	onLine func(string)
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.onLine != nil {
		for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
			b.onLine(l)
		}
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
