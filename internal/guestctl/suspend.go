// Package guestctl is what agent-vm asks of a running guest of its own:
// readying it for a suspend and back (Detach, Ready: the
// workspace unmounted and mounted again, agent-mcp stopped and started,
// the clock set, the start's setup), how the repository's provisioning went
// (CheckProvision), and whether its sshd and agent-mcp answer on their
// forwarded ports (SSHAnswers, CheckHealth). It knows no VM:
// the caller hands it a way to run a script as root in the guest, an SSH
// connection, or a port.
package guestctl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// BusyError is a suspend refused because processes in the guest use
// /workspace, which a suspend that saves the VM unmounts.
type BusyError struct {
	Branch, Slug string
	Processes    string // the guest's list: pid, command line, how
	// Instead, when set, is the caller's way to suspend the VM that keeps
	// them (a command and what it does), which the hint names first.
	Instead string
}

func (e *BusyError) Error() string {
	end := fmt.Sprintf("end them first (`agent-vm sessions %s` lists agent sessions; leave shells that are in %s)", e.Slug, guest.Workspace)
	if e.Instead != "" {
		return fmt.Sprintf("VM %q cannot be saved to disk: these processes in the guest use %s, which saving unmounts:\n%s\n(hint: %s; or %s)",
			e.Branch, guest.Workspace, termsafe.Indent(e.Processes), e.Instead, end)
	}
	return fmt.Sprintf("VM %q cannot be suspended: these processes in the guest use %s, which a suspend unmounts:\n%s\n(hint: %s, or keep the VM running; `agent-vm stop %s` shuts it down instead)",
		e.Branch, guest.Workspace, termsafe.Indent(e.Processes), end, e.Slug)
}

// detachScript readies the guest for its share to go (as root): lists the
// processes using /workspace other than agent-mcp's (which stops), and
// refuses (exit 3) if there are any; else stops agent-mcp, syncs and
// unmounts. A process can be reported as using the workspace by its
// working directory, an open file or a mapped one.
//
// One find and one grep look at every process: a readlink per open file,
// as this script first did, was about a thousand processes, 25-30 s of
// every suspend under TCG. Only a process found busy costs more.
const detachScript = `set -u
ws=` + guest.Workspace + `
mountpoint -q "$ws" || exit 0
busy() {
	hits=$( {
		find /proc/[0-9]*/cwd /proc/[0-9]*/fd -maxdepth 1 \( -lname "$ws" -o -lname "$ws/*" \) -printf '%p\t%l\n'
		grep -l -F " $ws/" /proc/[0-9]*/maps | sed 's/$/\tmapped/'
	} 2>/dev/null )
	[ -n "$hits" ] || return 0
	for pid in $(printf '%s\n' "$hits" | cut -d/ -f3 | sort -un); do
		[ "$pid" = "$$" ] && continue
		grep -q 'agent-mcp\.service' "/proc/$pid/cgroup" 2>/dev/null && continue
		mine=$(printf '%s\n' "$hits" | grep "^/proc/$pid/")
		how=
		printf '%s\n' "$mine" | grep -q "^/proc/$pid/cwd	" && how="working directory"
		f=$(printf '%s\n' "$mine" | grep "^/proc/$pid/fd/" | head -n 1 | cut -f 2)
		[ -n "$f" ] && how="${how:+$how, }open file $f"
		printf '%s\n' "$mine" | grep -q "^/proc/$pid/maps	" && how="${how:+$how, }mapped file"
		[ -n "$how" ] && printf '%s %s (%s)\n' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-100)" "$how"
	done
	return 0
}
out=$(busy)
if [ -n "$out" ]; then printf '%s\n' "$out"; exit 3; fi
systemctl stop agent-mcp.service
sync
if ! umount "$ws" 2>/dev/null; then
	busy
	systemctl start --no-block agent-mcp.service
	exit 3
fi
`

// clockScript steps the guest's clock (as root) by $1 seconds (with
// nanoseconds; negative: back): a restored guest keeps the time it was
// saved at, a paused one the time it was paused at. A step, not the host's
// time: the script starts seconds after it was written on a busy host
// under TCG (the session, sudo, the shell), and a time set then would be
// behind by as much. GNU date reads the step itself ("now + -2.5
// seconds"): one process, where reading the time, adding and setting were
// three. When it is all Ready does, the script's exit status is date's; a
// failed date does not keep the setup or the share from coming after it.
const clockScript = `date -u -s "now + $1 seconds" >/dev/null
`

// attachScript mounts the share again once its device is back (as root)
// and starts agent-mcp without waiting for it (the caller waits for its
// health; its start, the unit's sandbox set up under TCG and agent-vm's
// own, takes about two seconds, which the rest of the session, the
// start's setup, runs beside). A mount that fails sets mount_failed, so
// that the setup still runs. The devices' ids are read and the wait
// counted by the shell, not by a process each (each is 50-100 ms of a
// restored guest under TCG). The unit's start limit (3 starts a minute, against
// a crash loop) is reset first: each suspend stops agent-mcp and each
// resume starts it, so a fourth resume within a minute would otherwise
// leave it down.
const attachScript = `mount_failed=
i=0
while [ "$i" -lt 120 ]; do
	for d in /sys/bus/virtio/devices/*/device; do
		read -r id <"$d" 2>/dev/null || continue
		case $id in 0x001a|0x0009) break 2;; esac
	done
	sleep 0.5
	i=$((i + 1))
done
if /usr/local/lib/agent-vm/mount-workspace >/dev/null; then
	systemctl reset-failed agent-mcp.service 2>/dev/null
	systemctl start --no-block agent-mcp.service
else
	mount_failed=1
fi
`

// Root runs a shell script as root in a guest (its user has passwordless
// sudo); script is called once connected, so that what it says of the
// host (the time) is as fresh as can be.
type Root func(ctx context.Context, script func() string) (code int, stdout, stderr string, err error)

// Detach readies the guest of branch (VM slug) for its share to go
// (detachScript); a busy workspace is a *BusyError.
func Detach(ctx context.Context, root Root, branch, slug string) error {
	code, out, errOut, err := root(ctx, func() string { return detachScript })
	switch {
	case err != nil:
		return fmt.Errorf("readying the guest of %q for suspend: %w", branch, err)
	case code == 3:
		lines := strings.Split(strings.TrimSpace(out), "\n") // one process a line, each made safe
		for i, l := range lines {
			lines[i] = termsafe.Line(l)
		}
		return &BusyError{Branch: branch, Slug: slug, Processes: strings.Join(lines, "\n")}
	case code != 0:
		return fmt.Errorf("readying the guest of %q for suspend: exit %d: %s", branch, code, termsafe.String(strings.TrimSpace(errOut)))
	}
	return nil
}

// Readying is what Ready does in a restored guest, in this order.
type Readying struct {
	// Clock, when not nil, is how far the guest's clock is behind the
	// host's (OffsetOf); else, when Now is not nil, it is measured first
	// against Now, in a session of its own (clockOffset). The clock is
	// stepped by it (clockScript).
	Clock *time.Duration
	Now   func() time.Time
	// Mount mounts the workspace again once its device is back and starts
	// agent-mcp (attachScript): not when the share stayed mounted
	// (driver.Suspender's SuspendKeepsShare, a pause in place). A failed
	// mount fails Ready, after the setup.
	Mount bool
	// Setup is the start's guest setup (backend.Plan.Setup), "" for none.
	Setup string
	// FirstRun, when not "", is a root script run last, once the
	// workspace is mounted: a clone's first run when it installs nothing
	// (backend.Clone's Quick), which then needs no session and sudo of
	// its own, nor a wait that watches its progress (Settle).
	FirstRun string
}

// Empty reports whether r asks for nothing (Ready opens no session).
func (r Readying) Empty() bool {
	return r.Clock == nil && r.Now == nil && r.Setup == "" && !r.Mount && r.FirstRun == ""
}

// Readied is what failed of Ready's steps that do not keep the rest from
// running, each nil when it did not fail or did not run.
type Readied struct {
	SetupErr    error // the setup's (Readying.Setup)
	FirstRunErr error // the first run's (Readying.FirstRun)
}

// Ready readies a restored guest (a template's clone, a resumed VM) as r
// says, in one root session: under TCG the sudo and shell of a session on
// a guest QEMU has just restored take a second or two each. The setup and
// the first run failing is told in Readied, and does not keep the rest
// from running; err is the rest's failure. A session that ran the setup
// alone and failed is the setup failing. Nothing to do (a start whose
// backend has no setup) is no session.
func Ready(ctx context.Context, root Root, r Readying) (Readied, error) {
	if r.Empty() {
		return Readied{}, nil
	}
	if r.Clock == nil && r.Now != nil {
		off, err := clockOffset(ctx, root, r.Now)
		if err != nil {
			return Readied{}, fmt.Errorf("setting the guest's clock: %w", err)
		}
		r.Clock = &off
	}
	var b strings.Builder
	b.WriteString("set -u\n")
	if r.Clock != nil {
		fmt.Fprintf(&b, "set -- %.9f\n%s", r.Clock.Seconds(), clockScript)
	}
	// The workspace and agent-mcp before the setup: agent-mcp's start
	// then runs beside it (agent-mcp does not need it: its servers start
	// when a client comes, after the start returns).
	if r.Mount {
		b.WriteString(attachScript)
	}
	if err := readyStep(&b, r.Setup, setupEnd, setupFailed); err != nil {
		return Readied{}, err
	}
	if r.Mount {
		b.WriteString("[ -z \"$mount_failed\" ] || exit 1\n")
	}
	if err := readyStep(&b, r.FirstRun, firstRunEnd, firstRunFailed); err != nil {
		return Readied{}, err
	}
	code, out, errOut, err := root(ctx, func() string { return b.String() })
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, termsafe.String(strings.TrimSpace(errOut)))
	}
	rd := Readied{SetupErr: stepFailure(out, setupFailed), FirstRunErr: stepFailure(out, firstRunFailed)}
	switch {
	case err == nil:
		return rd, nil
	case r.Mount:
		return rd, fmt.Errorf("mounting the workspace in the guest again: %w", err)
	case r.Clock != nil:
		return rd, fmt.Errorf("setting the guest's clock: %w", err)
	case r.FirstRun == "":
		rd.SetupErr = errors.Join(rd.SetupErr, fmt.Errorf("running the guest's setup: %w", err))
		return rd, nil
	}
	return rd, fmt.Errorf("running the guest's setup: %w", err)
}

// readyStep adds script ("" for none) to Ready's script, in a shell of
// its own (a here-document ended by end) whose output is left out and
// whose errors are kept: a failure is told on stdout, on a line that
// begins with failed, which the rest of the script leaves to the steps.
func readyStep(b *strings.Builder, script, end, failed string) error {
	if script == "" {
		return nil
	}
	if strings.Contains("\n"+script+"\n", "\n"+end+"\n") {
		return fmt.Errorf("internal error: a script for the guest holds the line %s that ends it", end)
	}
	fmt.Fprintf(b, "step_err=$(sh -s 2>&1 >/dev/null <<'%[1]s'\n%[2]s\n%[1]s\n) || printf '%[3]s %%s\n%%s\n' \"$?\" \"$step_err\"\n",
		end, strings.TrimSuffix(script, "\n"), failed)
	return nil
}

// stepFailure reads what a readyStep whose lines begin with failed told
// in out (up to the next step's), nil when it did not fail.
func stepFailure(out, failed string) error {
	_, said, found := strings.Cut(out, failed+" ")
	if !found {
		return nil
	}
	said, _, _ = strings.Cut(said, "\n"+firstRunFailed+" ")
	status, said, _ := strings.Cut(said, "\n")
	return fmt.Errorf("exit status %s: %s", strings.TrimSpace(status), termsafe.String(execx.TailLines(strings.TrimSpace(said), 3)))
}

// The ends of the steps' here-documents in Ready's script, and the
// beginnings of the lines that tell their failures.
const (
	setupEnd       = "AGENT_VM_SETUP_END"
	setupFailed    = "agent-vm-setup-failed"
	firstRunEnd    = "AGENT_VM_FIRST_RUN_END"
	firstRunFailed = "agent-vm-first-run-failed"
)

// ReadClock ends a root script whose output OffsetOf reads: the guest's
// time, read just before the script ends.
const ReadClock = "date +%s.%N\n"

// OffsetOf is how far the guest's clock is behind the host's, from the
// output of a script that ended with ReadClock, all of it in at back (the
// host's time then).
func OffsetOf(out string, back time.Time) (time.Duration, error) {
	out = strings.TrimSpace(out)
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	g, err := parseEpoch(out)
	if err != nil {
		return 0, fmt.Errorf("reading the guest's clock: %w", err)
	}
	return back.Sub(g), nil
}

// clockOffset is how far the guest's clock is behind now(): the guest's
// time is read (as root, the same way the step will run) and compared
// with the host's when its answer is back. The guest read it just before
// answering, after the session's seconds of start-up on a busy host, so
// the answer's way back (milliseconds) is all the error.
func clockOffset(ctx context.Context, root Root, now func() time.Time) (time.Duration, error) {
	code, out, errOut, err := root(ctx, func() string { return ReadClock })
	back := now()
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, termsafe.String(strings.TrimSpace(errOut)))
	}
	if err != nil {
		return 0, fmt.Errorf("reading the guest's clock: %w", err)
	}
	return OffsetOf(out, back)
}

// parseEpoch reads `date +%s.%N`.
func parseEpoch(s string) (time.Time, error) {
	sec, frac, _ := strings.Cut(s, ".")
	secs, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not a time", s)
	}
	var nanos int64
	if frac != "" {
		frac = (frac + "000000000")[:9]
		if nanos, err = strconv.ParseInt(frac, 10, 64); err != nil {
			return time.Time{}, fmt.Errorf("%q is not a time", s)
		}
	}
	return time.Unix(secs, nanos), nil
}
