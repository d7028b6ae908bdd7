package guestctl

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A busy workspace's refusal names the processes and what to do: end
// them, and the caller's way that keeps them when it has one (a pause in
// place), else stop.
func TestBusyError(t *testing.T) {
	e := &BusyError{Branch: "feat/x", Slug: "feat-x", Processes: "42 claude (working directory)\n43 bash (working directory)"}
	for _, w := range []string{`VM "feat/x" cannot be suspended`, "\n  42 claude (working directory)\n  43 bash (working directory)\n", "`agent-vm sessions feat-x` lists agent sessions", "`agent-vm stop feat-x` shuts it down instead"} {
		if !strings.Contains(e.Error(), w) {
			t.Errorf("without a way to keep them: %q lacks %q", e.Error(), w)
		}
	}
	e.Instead = "`agent-vm suspend feat-x` without --save pauses the VM in place, keeping them"
	for _, w := range []string{`VM "feat/x" cannot be saved to disk`, "which saving unmounts", "(hint: `agent-vm suspend feat-x` without --save pauses the VM in place, keeping them; or end them first (`agent-vm sessions feat-x`"} {
		if !strings.Contains(e.Error(), w) {
			t.Errorf("with a way to keep them: %q lacks %q", e.Error(), w)
		}
	}
}

// fakeGuest is a Root that runs scripts with this host's sh and awk, and a
// stand-in `date` (labelled: it fakes the guest's clock, at the exec
// boundary) whose clock is behind by the offset in its state file; `date
// -s @T` records T as the guest's new time. Each script starts delay
// after it was asked for, as on a busy host under TCG.
type fakeGuest struct {
	dir   string
	delay time.Duration
}

func newFakeGuest(t *testing.T, behind, delay time.Duration) fakeGuest {
	t.Helper()
	dir := t.TempDir()
	date := `#!/bin/sh
# Stand-in for the guest's date: the host's time minus the guest's lag.
lag=$(cat "$FAKE_GUEST/lag")
case $1 in
+%s.%N) awk -v t="$(/bin/date +%s.%N)" -v l="$lag" 'BEGIN { printf "%.9f\n", t - l }' ;;
-u) [ "$2" = -s ] || exit 2
	t=${3#@}
	awk -v t="$t" -v now="$(/bin/date +%s.%N)" 'BEGIN { printf "%.9f\n", now - t }' >"$FAKE_GUEST/lag" ;;
*) exit 2 ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "date"), []byte(date), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lag"), []byte(fmt.Sprintf("%.9f\n", behind.Seconds())), 0o644); err != nil {
		t.Fatal(err)
	}
	return fakeGuest{dir: dir, delay: delay}
}

func (g fakeGuest) root(ctx context.Context, script func() string) (int, string, string, error) {
	s := script()
	time.Sleep(g.delay)
	cmd := exec.CommandContext(ctx, "sh", "-s")
	cmd.Stdin = strings.NewReader(s)
	cmd.Env = append(os.Environ(), "PATH="+g.dir+":"+os.Getenv("PATH"), "FAKE_GUEST="+g.dir)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errOut.String(), nil
	}
	return 0, out.String(), errOut.String(), err
}

func (g fakeGuest) lag(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.dir, "lag"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(f * float64(time.Second))
}

// A guest restored a minute behind is set to the host's time, however
// long its scripts take to start: the clock is stepped by the offset read
// just before, not set to a time taken when the script was written.
func TestSetClockStepsByTheOffset(t *testing.T) {
	g := newFakeGuest(t, time.Minute, time.Second)
	if err := SetClock(context.Background(), g.root, time.Now); err != nil {
		t.Fatal(err)
	}
	// Set to the host's time written into the script, the guest would lag
	// by the script's second of start-up.
	if lag := g.lag(t); lag < -300*time.Millisecond || lag > 300*time.Millisecond {
		t.Errorf("after SetClock the guest lags the host by %s, want about 0 (its scripts start a second late)", lag)
	}
	// Without a clock to set, nothing is stepped.
	g = newFakeGuest(t, time.Minute, 0)
	if err := SetClock(context.Background(), g.root, nil); err != nil {
		t.Fatal(err)
	}
	if lag := g.lag(t); lag < 59*time.Second {
		t.Errorf("SetClock without a time moved the guest's clock: lag %s", lag)
	}
}

func TestParseEpoch(t *testing.T) {
	for in, want := range map[string]time.Time{
		"1795908545.195221880": time.Unix(1795908545, 195221880),
		"1795908545.5":         time.Unix(1795908545, 500000000),
		"1795908545":           time.Unix(1795908545, 0),
	} {
		if got, err := parseEpoch(in); err != nil || !got.Equal(want) {
			t.Errorf("parseEpoch(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "12.x"} {
		if _, err := parseEpoch(bad); err == nil {
			t.Errorf("parseEpoch(%q) read it", bad)
		}
	}
}
