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
// boundary). Time is a fake host clock in a state file, which moves only
// when a script is asked for: each script starts delay after it was asked
// for, as on a busy host under TCG. The guest's clock is the host's minus
// the lag in another file; `date -u -s @T` sets the lag to what T leaves.
// No real time passes into the figures, so they are exact on any host.
type fakeGuest struct {
	dir   string
	delay time.Duration
}

const fakeEpoch = 1795908545 // the fake host clock's start, in seconds

func newFakeGuest(t *testing.T, behind, delay time.Duration) fakeGuest {
	t.Helper()
	dir := t.TempDir()
	date := `#!/bin/sh
# Stand-in for the guest's date: the fake host clock minus the guest's lag.
now=$(cat "$FAKE_GUEST/now")
lag=$(cat "$FAKE_GUEST/lag")
case $1 in
+%s.%N) awk -v t="$now" -v l="$lag" 'BEGIN { printf "%.9f\n", t - l }' ;;
-u) [ "$2" = -s ] || exit 2
	t=${3#@}
	awk -v t="$t" -v now="$now" 'BEGIN { printf "%.9f\n", now - t }' >"$FAKE_GUEST/lag" ;;
*) exit 2 ;;
esac
`
	g := fakeGuest{dir: dir, delay: delay}
	if err := os.WriteFile(filepath.Join(dir, "date"), []byte(date), 0o755); err != nil {
		t.Fatal(err)
	}
	g.write(t, "now", float64(fakeEpoch))
	g.write(t, "lag", behind.Seconds())
	return g
}

func (g fakeGuest) write(t *testing.T, name string, v float64) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(g.dir, name), []byte(fmt.Sprintf("%.9f\n", v)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (g fakeGuest) read(name string) (float64, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, name))
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
}

// now is the fake host clock.
func (g fakeGuest) now() time.Time {
	f, err := g.read("now")
	if err != nil {
		panic(err)
	}
	sec := int64(f)
	return time.Unix(sec, int64((f-float64(sec))*1e9+0.5))
}

func (g fakeGuest) root(ctx context.Context, script func() string) (int, string, string, error) {
	s := script()
	// The script's start-up, on the fake clock.
	now, err := g.read("now")
	if err != nil {
		return 0, "", "", err
	}
	if err := os.WriteFile(filepath.Join(g.dir, "now"), []byte(fmt.Sprintf("%.9f\n", now+g.delay.Seconds())), 0o644); err != nil {
		return 0, "", "", err
	}
	cmd := exec.CommandContext(ctx, "sh", "-s")
	cmd.Stdin = strings.NewReader(s)
	cmd.Env = append(os.Environ(), "PATH="+g.dir+":"+os.Getenv("PATH"), "FAKE_GUEST="+g.dir)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errOut.String(), nil
	}
	return 0, out.String(), errOut.String(), err
}

func (g fakeGuest) lag(t *testing.T) time.Duration {
	t.Helper()
	f, err := g.read("lag")
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
	if err := SetClock(context.Background(), g.root, g.now); err != nil {
		t.Fatal(err)
	}
	// Set to the host's time written into the script, the guest would lag
	// by the script's second of start-up. (Within a microsecond: awk's
	// floating point.)
	if lag := g.lag(t); lag < -time.Microsecond || lag > time.Microsecond {
		t.Errorf("after SetClock the guest lags the host by %s, want 0 (its scripts start a second late)", lag)
	}
	// Without a clock to set, nothing is stepped.
	g = newFakeGuest(t, time.Minute, 0)
	if err := SetClock(context.Background(), g.root, nil); err != nil {
		t.Fatal(err)
	}
	if lag := g.lag(t); lag != time.Minute {
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
