package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/blackbox"
)

// agentVM runs the agent-vm binary: the harness touches agent-vm only
// through its command line, like a user.
type agentVM struct {
	bin      string
	stateDir string
	// dir is where commands run: not a git checkout, so no command picks
	// up a branch from it.
	dir string
}

// Timeouts for agent-vm calls; boots under TCG on a loaded machine take
// minutes.
const (
	quickTimeout = 2 * time.Minute
	bootTimeout  = 20 * time.Minute
	stopTimeout  = 3 * time.Minute
)

// spec is the cmdSpec of an agent-vm call; prefix runs it through another
// program (unshare for the 9p share).
func (a *agentVM) spec(timeout time.Duration, prefix []string, args ...string) cmdSpec {
	argv := append([]string{a.bin, "--state-dir", a.stateDir}, args...)
	argv = append(append([]string(nil), prefix...), argv...)
	return cmdSpec{Path: argv[0], Args: argv[1:], Dir: a.dir, Timeout: timeout}
}

// run runs agent-vm with args; a non-zero exit is an error.
func (a *agentVM) run(ctx context.Context, timeout time.Duration, args ...string) cmdResult {
	return runCmd(ctx, a.spec(timeout, nil, args...))
}

func (a *agentVM) status(ctx context.Context, name string) (*blackbox.Status, error) {
	res := a.run(ctx, quickTimeout, "status", "--json", name)
	if res.Err != nil {
		return nil, res.Err
	}
	var st blackbox.Status
	if err := json.Unmarshal([]byte(res.Stdout), &st); err != nil {
		return nil, fmt.Errorf("reading `%s`: %w", res.Line, err)
	}
	return &st, nil
}

func (a *agentVM) list(ctx context.Context) ([]blackbox.Status, error) {
	res := a.run(ctx, quickTimeout, "list", "--json")
	if res.Err != nil {
		return nil, res.Err
	}
	var list []blackbox.Status
	if err := json.Unmarshal([]byte(res.Stdout), &list); err != nil {
		return nil, fmt.Errorf("reading `%s`: %w", res.Line, err)
	}
	return list, nil
}

// bootTimes is what one `agent-vm start` took, in seconds.
type bootTimes struct {
	// Wall is from running `start` to its exit: SSH and agent-mcp ready,
	// as the user waits for it.
	Wall float64
	// SSHWall is from running `start` to agent-vm seeing SSH answer with
	// the pinned key (the time stamp of its "ssh ready" debug log).
	SSHWall float64
	// SSHLaunch is start's own SSH figure, from QEMU's launch (the debug
	// log's exact value).
	SSHLaunch float64
	// HealthLaunch is start's agent-mcp figure from QEMU's launch, as it
	// prints it (whole seconds).
	HealthLaunch float64
	Share        string
	Accel        string // "" for a resume, which prints none
	// Said is the summary line start (or resume) printed: it names the
	// path a boot took when there are several.
	Said string
}

// startedLine is start's (or resume's) summary line on stdout.
var startedLine = regexp.MustCompile(`(?m)^.*SSH after (\S+), agent-mcp after (\S+) \((?:(\w+), )?workspace over (\S+)\)$`)

// start boots a VM and reads how long the phases took from start's output
// (--verbose --log-format json makes its debug log machine-readable);
// flags are more of start's flags.
func (a *agentVM) start(ctx context.Context, name string, prefix []string, flags ...string) (bootTimes, error) {
	args := append(append([]string{"--verbose", "--log-format", "json", "start"}, flags...), name)
	res := runCmd(ctx, a.spec(bootTimeout, prefix, args...))
	if res.Err != nil {
		return bootTimes{}, res.Err
	}
	return parseStart(res)
}

// resume resumes a suspended VM and reads its times as start's.
func (a *agentVM) resume(ctx context.Context, name string) (bootTimes, error) {
	res := runCmd(ctx, a.spec(bootTimeout, nil, "--verbose", "--log-format", "json", "resume", name))
	if res.Err != nil {
		return bootTimes{}, res.Err
	}
	return parseStart(res)
}

// parseStart reads a finished start's output.
func parseStart(res cmdResult) (bootTimes, error) {
	t := bootTimes{Wall: res.Seconds()}
	m := startedLine.FindStringSubmatch(res.Stdout)
	if m == nil {
		return t, fmt.Errorf("`%s` did not print its \"... VM ...: SSH after ..., agent-mcp after ...\" line; stdout: %q", res.Line, tail(res.Stdout, 3))
	}
	health, err := time.ParseDuration(m[2])
	if err != nil {
		return t, fmt.Errorf("reading start's agent-mcp time %q: %w", m[2], err)
	}
	t.HealthLaunch, t.Accel, t.Share, t.Said = health.Seconds(), m[3], m[4], strings.TrimSpace(m[0])
	sc := bufio.NewScanner(strings.NewReader(res.Stderr))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Message   string    `json:"@message"`
			Timestamp time.Time `json:"@timestamp"`
			After     int64     `json:"after"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Message != "ssh ready" {
			continue
		}
		t.SSHWall = line.Timestamp.Sub(res.Start).Seconds()
		t.SSHLaunch = time.Duration(line.After).Seconds()
		return t, nil
	}
	return t, fmt.Errorf("`%s` logged no \"ssh ready\" debug line (stderr ends: %s)", res.Line, tail(res.Stderr, 3))
}
