package guestctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/testutil"
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
// the lag in another file; `date -u -s "now + D seconds"` takes D off it.
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
	case $3 in
	"now + "*" seconds") d=${3#now + } d=${d% seconds} ;;
	*) exit 2 ;;
	esac
	awk -v l="$lag" -v d="$d" 'BEGIN { printf "%.9f\n", l - d }' >"$FAKE_GUEST/lag" ;;
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
func TestReadySetsTheClockByTheOffset(t *testing.T) {
	ctx := context.Background()
	g := newFakeGuest(t, time.Minute, time.Second)
	if _, err := Ready(ctx, g.root, Readying{Now: g.now}); err != nil {
		t.Fatal(err)
	}
	// Set to the host's time written into the script, the guest would lag
	// by the script's second of start-up. (Within a microsecond: awk's
	// floating point.)
	if lag := g.lag(t); lag < -time.Microsecond || lag > time.Microsecond {
		t.Errorf("after Ready the guest lags the host by %s, want 0 (its scripts start a second late)", lag)
	}
	// Without a clock to set, nothing is stepped.
	g = newFakeGuest(t, time.Minute, 0)
	if _, err := Ready(ctx, g.root, Readying{}); err != nil {
		t.Fatal(err)
	}
	if lag := g.lag(t); lag != time.Minute {
		t.Errorf("Ready without a clock moved the guest's clock: lag %s", lag)
	}
}

// The step clockScript gives the guest's GNU date ("now + D seconds",
// D with nanoseconds, negative too) is read as a step by the real date
// (Debian's coreutils, as in the guest): asked with -d here, which prints
// the time without setting this host's clock.
func TestGNUDateReadsTheClockStep(t *testing.T) {
	date := testutil.Program(t, "date")
	if !strings.Contains(clockScript, `date -u -s "now + $1 seconds"`) {
		t.Fatalf("clockScript no longer gives date the form this test reads:\n%s", clockScript)
	}
	for _, step := range []float64{-3.25, 215.123456789, -0.5} {
		before := time.Now()
		out, err := exec.Command(date, "-u", "-d", fmt.Sprintf("now + %.9f seconds", step), "+%s.%N").Output()
		after := time.Now()
		if err != nil {
			t.Fatalf("date -d 'now + %.9f seconds': %v", step, err)
		}
		got, err := parseEpoch(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatal(err)
		}
		d := time.Duration(step * float64(time.Second))
		if got.Before(before.Add(d).Add(-time.Millisecond)) || got.After(after.Add(d).Add(time.Millisecond)) {
			t.Errorf("date read the step %.9f s as %s, want between %s and %s", step, got, before.Add(d), after.Add(d))
		}
	}
}

// A start with nothing to ready (its backend has no setup, no clock to
// set, no share to mount) opens no session: the cold start's setup went
// through Ready, where an empty setup had been no session before.
func TestReadyWithNothingToDoRunsNothing(t *testing.T) {
	called := false
	root := func(context.Context, func() string) (int, string, string, error) {
		called = true
		return 0, "", "", nil
	}
	if rd, err := Ready(context.Background(), root, Readying{}); rd != (Readied{}) || err != nil || called {
		t.Errorf("Ready(nothing) = %+v, %v, session opened: %v", rd, err, called)
	}
}

// A clone's clock is read at the end of the script that gives it its
// identity (ReadClock), in the same session: OffsetOf reads the last line.
func TestOffsetOfReadsTheLastLine(t *testing.T) {
	g := newFakeGuest(t, 90*time.Second, 0)
	code, out, _, err := g.root(context.Background(), func() string { return "echo personalized\n" + ReadClock })
	if err != nil || code != 0 {
		t.Fatal(code, err)
	}
	off, err := OffsetOf(out, g.now())
	if err != nil || off != 90*time.Second {
		t.Errorf("OffsetOf(%q) = %s, %v; want 1m30s", out, off, err)
	}
	for _, bad := range []string{"", "personalized\n", "1795908545.1\nnot a time\n"} {
		if _, err := OffsetOf(bad, g.now()); err == nil {
			t.Errorf("OffsetOf(%q) read a time", bad)
		}
	}
}

// The start's setup runs in Ready's one session, in a shell of its own:
// its output stays out of Ready's, and its failure is setupErr, which
// neither stops the clock nor becomes Ready's error.
func TestReadyRunsTheSetupInTheSameSession(t *testing.T) {
	ctx := context.Background()
	g := newFakeGuest(t, time.Minute, 0)
	mark := filepath.Join(g.dir, "setup-ran")
	// A here-document, quotes, $ and an exit of its own, as a rendered
	// setup may have.
	setup := "set -eu\necho noise\ncat >" + mark + " <<'EOF'\n$HOME 'quoted' \"double\"\nEOF\nexit 0\n"
	off := 30 * time.Second
	rd, err := Ready(ctx, g.root, Readying{Clock: &off, Setup: setup})
	if err != nil || rd != (Readied{}) {
		t.Fatalf("Ready = %+v, %v", rd, err)
	}
	if b, err := os.ReadFile(mark); err != nil || string(b) != "$HOME 'quoted' \"double\"\n" {
		t.Errorf("the setup's file: %q, %v", b, err)
	}
	if lag := g.lag(t); lag < 30*time.Second-time.Microsecond || lag > 30*time.Second+time.Microsecond {
		t.Errorf("the clock was not stepped by 30s: lag %s", lag)
	}

	g = newFakeGuest(t, time.Minute, 0)
	failing := "echo one >&2\necho two >&2\necho three >&2\necho four >&2\nexit 4\n"
	rd, err = Ready(ctx, g.root, Readying{Clock: &off, Setup: failing})
	if err != nil {
		t.Fatalf("a failed setup failed Ready: %v", err)
	}
	if rd.SetupErr == nil || rd.SetupErr.Error() != `exit status 4: two\nthree\nfour` || rd.FirstRunErr != nil { // made safe for a terminal: one line
		t.Errorf("Readied = %+v; want the setup's exit status 4 and its last three lines", rd)
	}
	if lag := g.lag(t); lag > 30*time.Second+time.Microsecond {
		t.Errorf("a failed setup kept the clock from being set: lag %s", lag)
	}

	// A session that ran the setup alone and failed is the setup failing.
	broken := func(context.Context, func() string) (int, string, string, error) {
		return 0, "", "", errors.New("session lost")
	}
	if rd, err := Ready(ctx, broken, Readying{Setup: setup}); err != nil || rd.SetupErr == nil || !strings.Contains(rd.SetupErr.Error(), "running the guest's setup: session lost") {
		t.Errorf("a failed session with the setup alone: %+v, %v; want the setup's failure", rd, err)
	}
	if _, err := Ready(ctx, broken, Readying{Setup: setup, Mount: true}); err == nil || !strings.Contains(err.Error(), "mounting the workspace") {
		t.Errorf("a failed session with the mount: %v; want Ready's error", err)
	}

	if _, err := Ready(ctx, g.root, Readying{Setup: "echo\n" + setupEnd + "\n"}); err == nil || !strings.Contains(err.Error(), setupEnd) {
		t.Errorf("a setup holding the line that ends it: %v", err)
	}
}

// A clone's first run goes last in Ready's session, in a shell of its
// own: it runs after the setup, only once the workspace is mounted, and
// its failure is told apart from the setup's, without failing Ready.
func TestReadyRunsTheFirstRunLast(t *testing.T) {
	ctx := context.Background()
	g := newFakeGuest(t, time.Minute, 0)
	order := filepath.Join(g.dir, "order")
	setup := "echo setup >>" + order + "\necho setup failed >&2\nexit 2\n"
	first := "set -eu\necho first >>" + order + "\necho noise\necho it failed >&2\nexit 5\n"
	rd, err := Ready(ctx, g.root, Readying{Setup: setup, FirstRun: first})
	if err != nil {
		t.Fatalf("a failed first run failed Ready: %v", err)
	}
	if b, _ := os.ReadFile(order); string(b) != "setup\nfirst\n" {
		t.Errorf("the steps ran in the order %q, want the setup, then the first run", b)
	}
	if rd.SetupErr == nil || rd.SetupErr.Error() != "exit status 2: setup failed" ||
		rd.FirstRunErr == nil || rd.FirstRunErr.Error() != "exit status 5: it failed" {
		t.Errorf("Readied = %+v; want the setup's exit 2 and the first run's exit 5, each with its own words", rd)
	}

	// A workspace that does not mount: no first run. (No virtio device
	// here: the mount script fails at once.)
	os.Remove(order)
	g = newFakeGuest(t, time.Minute, 0)
	_, err = Ready(ctx, func(ctx context.Context, script func() string) (int, string, string, error) {
		return g.root(ctx, func() string {
			s := script()
			return strings.Replace(s, attachScript, "mount_failed=1\n", 1)
		})
	}, Readying{Mount: true, FirstRun: first})
	if err == nil || !strings.Contains(err.Error(), "mounting the workspace") {
		t.Errorf("Ready with a failed mount: %v", err)
	}
	if _, err := os.Stat(order); !os.IsNotExist(err) {
		t.Errorf("the first run ran without the workspace (%v)", err)
	}

	if _, err := Ready(ctx, g.root, Readying{FirstRun: "echo\n" + firstRunEnd + "\n"}); err == nil || !strings.Contains(err.Error(), firstRunEnd) {
		t.Errorf("a first run holding the line that ends it: %v", err)
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
