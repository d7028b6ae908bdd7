package image

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

// The base image runs cloud-init's boot stages in one Python process
// (guest/cloud-init-server), which the stage units reach through
// guest/cloud-init-stage. These tests run both on the host as the guest
// does, with the run directory moved into the test's and, in place of
// cloud-init's Python package, one whose main() records each stage it is
// asked for.

// stageRunDir is the run directory the guest files name.
const stageRunDir = "/run/agent-vm-cloud-init"

// fakeCloudInit is cloudinit/cmd/main.py of the stand-in: it records its
// arguments, pid, parent and NOTIFY_SOCKET, prints a line, hangs on the
// stage $FAKE_HANG names, and ends as cloud-init's main would: returning
// an error count, or through sys.exit.
const fakeCloudInit = `import json, os, sys, time

def main(argv):
    stage = " ".join(argv[1:])
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps({"argv": argv, "pid": os.getpid(), "ppid": os.getppid(),
                            "notify": os.environ.get("NOTIFY_SOCKET", "")}) + "\n")
    if stage == os.environ.get("FAKE_HANG"):
        time.sleep(3600)
    print("stage output:", stage)
    if stage == "modules --mode=final":
        sys.exit(300)
    return {"init --local": None, "init": 0, "modules --mode=config": 3}[stage]
`

type stageRecord struct {
	Argv   []string `json:"argv"`
	PID    int      `json:"pid"`
	PPID   int      `json:"ppid"`
	Notify string   `json:"notify"`
}

// stageFixture holds the guest's two scripts, moved to the test's run
// directory, and the stand-in for cloud-init.
type stageFixture struct {
	python, bash    string
	server, stage   string // the scripts
	run, pkg, log   string
	notify          *net.UnixConn
	notifyPath      string
	serverProcess   *exec.Cmd
	serverExited    chan error
	serverDiagnosis bytes.Buffer
}

func newStageFixture(t *testing.T) *stageFixture {
	t.Helper()
	dir := t.TempDir()
	f := &stageFixture{
		python: testutil.Program(t, "python3"), bash: testutil.Program(t, "bash"),
		run: filepath.Join(dir, "run"), pkg: filepath.Join(dir, "pkg"), log: filepath.Join(dir, "stages.log"),
		server: filepath.Join(dir, "cloud-init-server"), stage: filepath.Join(dir, "cloud-init-stage"),
	}
	for src, dst := range map[string]string{"guest/cloud-init-server": f.server, "guest/cloud-init-stage": f.stage} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(stageRunDir)) {
			t.Fatalf("%s does not name %s", src, stageRunDir)
		}
		if err := os.WriteFile(dst, bytes.ReplaceAll(b, []byte(stageRunDir), []byte(f.run)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{"cloudinit/__init__.py": "", "cloudinit/cmd/__init__.py": "", "cloudinit/cmd/main.py": fakeCloudInit} {
		p := filepath.Join(f.pkg, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.notifyPath = filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: f.notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f.notify = conn
	return f
}

// startServer starts the server as systemd would, with env added, and
// waits for its READY=1.
func (f *stageFixture) startServer(t *testing.T, env ...string) {
	t.Helper()
	c := exec.Command(f.python, f.server)
	c.Env = append(os.Environ(), append([]string{"PYTHONPATH=" + f.pkg, "FAKE_LOG=" + f.log, "NOTIFY_SOCKET=" + f.notifyPath}, env...)...)
	c.Stdout, c.Stderr = &f.serverDiagnosis, &f.serverDiagnosis
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	f.serverProcess, f.serverExited = c, make(chan error, 1)
	go func() { f.serverExited <- c.Wait() }()
	// The server and the stages it forked, wherever the test ends.
	t.Cleanup(func() { _ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL) })
	if got := f.nextNotification(t); got != "READY=1" {
		t.Fatalf("the server's first notification: got %q, want READY=1\n%s", got, &f.serverDiagnosis)
	}
}

func (f *stageFixture) nextNotification(t *testing.T) string {
	t.Helper()
	buf := make([]byte, 256)
	// Python's start on a busy machine, not a timing claim.
	_ = f.notify.SetReadDeadline(time.Now().Add(2 * time.Minute))
	n, err := f.notify.Read(buf)
	if err != nil {
		t.Fatalf("no notification from the server: %v\n%s", err, &f.serverDiagnosis)
	}
	return string(buf[:n])
}

// runStage runs cloud-init-stage STAGE COMMAND... and returns its exit
// status and stderr.
func (f *stageFixture) runStage(t *testing.T, stage string, command ...string) (int, string) {
	t.Helper()
	c := exec.Command(f.bash, append([]string{f.stage, stage}, command...)...)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	err := c.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	case err != nil:
		t.Fatal(err)
	}
	return 0, stderr.String()
}

func (f *stageFixture) records(t *testing.T) []stageRecord {
	t.Helper()
	b, err := os.ReadFile(f.log)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var recs []stageRecord
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var r stageRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("stage log %q: %v", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	return recs
}

// Each stage runs in a child of the server, as /usr/bin/cloud-init would
// run it, and cloud-init-stage exits with its exit status; the stage's own
// command (here sh -c 'exit 99') is not run. After the final stage the
// server exits and leaves nothing in its run directory.
func TestCloudInitServerRunsEachStageInAChild(t *testing.T) {
	f := newStageFixture(t)
	f.startServer(t)
	notRun := []string{"sh", "-c", "exit 99"}
	for _, s := range []struct {
		stage string
		want  int
	}{{"local", 0}, {"network", 0}, {"config", 3}, {"final", 300 & 0xFF}} {
		if code, stderr := f.runStage(t, s.stage, notRun...); code != s.want {
			t.Errorf("stage %s: exit status %d, want %d\n%s\nserver:\n%s", s.stage, code, s.want, stderr, &f.serverDiagnosis)
		}
	}
	select {
	case err := <-f.serverExited:
		if err != nil {
			t.Errorf("server: %v\n%s", err, &f.serverDiagnosis)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the server did not exit after the final stage\n%s", &f.serverDiagnosis)
	}
	recs := f.records(t)
	want := [][]string{
		{"/usr/bin/cloud-init", "init", "--local"},
		{"/usr/bin/cloud-init", "init"},
		{"/usr/bin/cloud-init", "modules", "--mode=config"},
		{"/usr/bin/cloud-init", "modules", "--mode=final"},
	}
	if len(recs) != len(want) {
		t.Fatalf("stages run: got %+v, want %q", recs, want)
	}
	server := f.serverProcess.Process.Pid
	var pids []int
	for i, r := range recs {
		if !slices.Equal(r.Argv, want[i]) || r.PPID != server || r.PID == server || r.Notify != "" {
			t.Errorf("stage %d: got %+v, want argv %q in a child of the server (pid %d) without NOTIFY_SOCKET", i, r, want[i], server)
		}
		pids = append(pids, r.PID)
	}
	if slices.Sort(pids); len(slices.Compact(pids)) != len(want) {
		t.Errorf("stages shared a process: pids %v", pids)
	}
	if out := f.serverDiagnosis.String(); !strings.Contains(out, "stage output: modules --mode=final") {
		t.Errorf("the stages' output does not reach the server's:\n%s", out)
	}
	if left, _ := os.ReadDir(f.run); len(left) > 0 {
		t.Errorf("the run directory keeps %v", left)
	}
}

// Without a live server (none started, or one whose pid file outlived it)
// cloud-init-stage runs the stage's own command, as Debian's unit does.
func TestCloudInitStageWithoutAServerRunsTheCommand(t *testing.T) {
	f := newStageFixture(t)
	check := func(what string) {
		t.Helper()
		code, stderr := f.runStage(t, "local", "sh", "-c", "exit 7")
		if code != 7 || !strings.Contains(stderr, "no cloud-init server; running sh -c exit 7 itself") {
			t.Errorf("%s: exit status %d, stderr %q; want 7 from the command itself", what, code, stderr)
		}
	}
	check("no run directory")

	gone := exec.Command("sh", "-c", "exit 0")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(f.run, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(f.run, "requests"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.run, "server.pid"), []byte(strconv.Itoa(gone.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("a server that has gone")
	if recs := f.records(t); len(recs) != 0 {
		t.Errorf("stages run: %+v", recs)
	}
}

// A server that ends during a stage fails that stage rather than leaving
// its unit waiting.
func TestCloudInitStageFailsWhenTheServerDies(t *testing.T) {
	f := newStageFixture(t)
	f.startServer(t, "FAKE_HANG=init")
	if code, stderr := f.runStage(t, "local", "sh", "-c", "exit 99"); code != 0 {
		t.Fatalf("stage local: exit status %d\n%s\n%s", code, stderr, &f.serverDiagnosis)
	}
	type result struct {
		code   int
		stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stderr := f.runStage(t, "network", "sh", "-c", "exit 99")
		done <- result{code, stderr}
	}()
	testutil.WaitFor(t, "the network stage to start", func() bool { return len(f.records(t)) == 2 })
	if err := f.serverProcess.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.code != 1 || !strings.Contains(r.stderr, "ended before the network stage did") {
			t.Errorf("stage network: exit status %d, stderr %q; want 1, naming the server's end", r.code, r.stderr)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("cloud-init-stage still waits for a server that is gone")
	}
}
