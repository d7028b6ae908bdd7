package guestctl

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Settling is a wait for the guest's own setup to finish (a first boot's
// packages, agent CLIs and provisioning: backend.Plan.Settle). A first
// boot takes minutes under TCG and longer on a busy host, more when it
// installs an agent CLI from npm; no time is right for all hosts, so the
// wait has none: it goes on while the guest makes progress, and ends with
// a StallError once it has made none for Stall.
//
// Progress is the guest's setup log growing, or the guest's CPUs busy for
// at least a quarter of one over a probe's interval (npm downloading and
// unpacking prints nothing for minutes, but keeps a CPU busy; a guest that
// waits on nothing is idle). Each probe reports the log's last line.
type Settling struct {
	// Command waits for the setup in the guest, or does it (run as the
	// SSH user), reading Input.
	Command string
	Input   string
	// Log is the guest's setup log ("" for none), read with sudo -n where
	// the user cannot read it.
	Log string
	// Stall is how long the guest may make no progress.
	Stall time.Duration
	// Every is how often the guest is probed.
	Every time.Duration
	// Report, when set, receives the log's last line at each probe.
	Report func(last string)

	// procStat is the guest's /proc/stat ("": that); tests set another.
	procStat string
}

// StallError ends a Settle whose guest made no progress for Stall.
type StallError struct {
	Stall time.Duration
	Log   string // the setup log's path in the guest
	Last  string // its last line
	// Probe is why the last look at the guest failed, nil if it answered.
	Probe error
}

func (e *StallError) Error() string {
	s := fmt.Sprintf("the guest's setup made no progress for %s (its CPUs idle", e.Stall)
	if e.Log != "" {
		s += ", nothing added to " + e.Log
	}
	s += ")"
	if e.Last != "" {
		s += "; its last line: " + termsafe.Line(e.Last)
	}
	if e.Probe != nil {
		s += "; the last look at the guest failed: " + termsafe.Line(e.Probe.Error())
	}
	return s
}

// Settle runs s.Command over c until it ends, probing the guest every
// s.Every over the same connection; it returns the command's failure, a
// *StallError, or ctx's error. A probe that fails or does not answer
// within settleProbeWait counts as a look that saw nothing move. The
// connection is kept alive as ssh's ServerAliveInterval would: one whose
// far end stops answering (a guest hung, a forward or a link to another
// host gone silent with its TCP connection open) is closed after
// settleMissed probes' time, which ends the wait with that said, where it
// would otherwise wait for ever on a command that can no longer end.
func Settle(ctx context.Context, c *ssh.Client, s Settling) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		var errOut strings.Builder
		code, err := sshx.Run(cctx, c, s.Command, strings.NewReader(s.Input), nil, &errOut)
		if err == nil && code != 0 {
			err = fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(errOut.String()))
		}
		done <- err
	}()
	lost := make(chan error, 1)
	go func() {
		if err := sshx.Keepalive(cctx, c, s.Every, settleMissed, nil); err != nil {
			lost <- err
			c.Close()
		}
	}()
	var last settleProbe
	var probeErr error
	moved, quiet := time.Now(), 0 // quiet: the probes since that saw nothing move
	t := time.NewTicker(s.Every)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			select {
			case why := <-lost:
				return fmt.Errorf("the guest's SSH stopped answering while its setup ran (%v), so agent-vm closed the connection: %w", why, err)
			default:
			}
			return err
		case <-t.C:
		}
		pctx, pcancel := context.WithTimeout(cctx, max(settleProbeWait, 2*s.Every))
		p, err := probeSettle(pctx, c, s.Log, s.procStat)
		pcancel()
		switch {
		case err != nil:
			// The next probe may answer: the command's end, or the stall
			// limit, decides.
			probeErr = err
			quiet++
		default:
			probeErr = nil
			if s.Report != nil && p.last != "" {
				s.Report(p.last)
			}
			if last.ok && (p.logSize > last.logSize || p.busy-last.busy >= uint64(settleShare*clockTicks*s.Every.Seconds())) {
				moved, quiet = time.Now(), 0
			} else {
				quiet++
			}
			last = p
		}
		// Two probes at least must have seen nothing move: one probe late
		// or failing on a busy host is no stall.
		if quiet >= 2 && time.Since(moved) >= s.Stall {
			// The command's session is closed; it returns when the caller
			// closes the connection, if the guest's sshd takes no signal.
			return &StallError{Stall: s.Stall, Log: s.Log, Last: last.last, Probe: probeErr}
		}
	}
}

// settleMissed is how many probe intervals in a row a keepalive may go
// unanswered before Settle closes the connection (two minutes at start's
// ten seconds: a guest busy installing packages under TCG answers within
// seconds); settleProbeWait is how long one probe may take.
const (
	settleMissed    = 12
	settleProbeWait = 30 * time.Second
)

// settleShare is the part of one CPU the guest must use over a probe's
// interval for it to count as progress.
const settleShare = 0.25

// clockTicks is the guest kernel's USER_HZ, the unit of /proc/stat.
const clockTicks = 100

// settleProbe is one look at the guest: its CPUs' busy time (in clock
// ticks), the setup log's size and last line.
type settleProbe struct {
	ok      bool
	busy    uint64
	logSize int64
	last    string
}

// probeSettle reads the guest's /proc/stat cpu line (from stat, "" for
// /proc/stat), then the log's size and last line (through sudo -n when the
// user cannot read it).
func probeSettle(ctx context.Context, c *ssh.Client, log, stat string) (settleProbe, error) {
	if stat == "" {
		stat = "/proc/stat"
	}
	script := "head -n 1 " + sshx.Quote([]string{stat})
	if log != "" {
		q := sshx.Quote([]string{log})
		script += fmt.Sprintf(`; r=; [ -r %[1]s ] || r="sudo -n"; $r stat -c %%s %[1]s 2>/dev/null || echo 0; $r tail -n 1 %[1]s 2>/dev/null`, q)
	}
	var out strings.Builder
	if _, err := sshx.Run(ctx, c, script, nil, &out, nil); err != nil {
		return settleProbe{}, err
	}
	return parseSettleProbe(out.String())
}

// parseSettleProbe reads probeSettle's output.
func parseSettleProbe(out string) (settleProbe, error) {
	lines := strings.SplitN(out, "\n", 3)
	f := strings.Fields(lines[0])
	if len(f) < 5 || f[0] != "cpu" {
		return settleProbe{}, fmt.Errorf("not a /proc/stat cpu line: %q", lines[0])
	}
	var busy uint64
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return settleProbe{}, fmt.Errorf("/proc/stat cpu line: %q", lines[0])
		}
		if i != 3 && i != 4 { // idle and iowait are not work
			busy += n
		}
	}
	p := settleProbe{ok: true, busy: busy}
	if len(lines) > 1 {
		p.logSize, _ = strconv.ParseInt(strings.TrimSpace(lines[1]), 10, 64)
	}
	if len(lines) > 2 {
		p.last = strings.TrimSpace(lines[2])
	}
	return p, nil
}
