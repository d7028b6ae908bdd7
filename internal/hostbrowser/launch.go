package hostbrowser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/proc"
)

// The files in the browser's directory (hostdir.Table.Browser).
const (
	profileDir = "profile"      // the user data directory, 0700
	logFile    = "chromium.log" // its stdout and stderr
	pidFile    = "chromium.pid"
	// activePortFile is what Chromium with a window writes in its profile
	// once its DevTools endpoint listens: the port, then the browser
	// target's path (see listeningTarget).
	activePortFile = "DevToolsActivePort"
)

// DefaultWait is how long a launch waits for the endpoint to answer.
const DefaultWait = 30 * time.Second

// Options say which browser to launch, where, and how.
type Options struct {
	Run execx.Runner
	// Dir is the browser's directory (hostdir.Table.Browser).
	Dir *hostdir.Dir
	// Binary is the browser to run ("": Find's).
	Binary string
	// Port is the DevTools port on 127.0.0.1 (0: DefaultPort).
	Port int
	// Getenv says whether there is a display (nil: os.Getenv).
	Getenv func(string) string
	// Wait bounds the wait for the endpoint (0: DefaultWait).
	Wait time.Duration
}

// Launched is a browser agent-vm launched.
type Launched struct {
	Pid     int
	Port    int    // its DevTools endpoint is 127.0.0.1:Port
	Profile string // its user data directory
	Log     string // its output
	// DevTools is what its endpoint answered (set by Launch).
	DevTools bridge.DevTools
	// Reused: it ran already (Launch started none).
	Reused bool
	// Headless: started without a window, there being no display.
	Headless bool
	// Warnings are for the user (NoSandboxWarning).
	Warnings []string
}

func (o Options) profile() string { return filepath.Join(o.Dir.Path, profileDir) }
func (o Options) pidPath() string { return filepath.Join(o.Dir.Path, pidFile) }
func (o Options) logPath() string { return filepath.Join(o.Dir.Path, logFile) }

// Running returns the browser agent-vm launched with o's profile when it
// runs: the pid its pid file names if that process is still it, else any
// process that is (a pid file lost or overwritten).
func Running(o Options) (Launched, bool) {
	match := isLaunched(o.profile())
	pid, _ := proc.ReadPid(o.pidPath())
	if !proc.Verified(pid, match) {
		pid = proc.Find(match)
	}
	args := proc.Args(pid)
	if pid == 0 || args == nil || !match(args) {
		return Launched{}, false
	}
	return Launched{Pid: pid, Port: portOf(args), Profile: o.profile(), Log: o.logPath(),
		Headless: isHeadless(args)}, true
}

func isHeadless(args []string) bool {
	for _, a := range args {
		if a == "--headless" || strings.HasPrefix(a, "--headless=") {
			return true
		}
	}
	return false
}

// Launch starts the browser, detached, and waits until its DevTools
// endpoint answers; one agent-vm launched with this profile that runs
// already is reused, on the port it has (Launched.Port), as a profile
// serves one browser at a time. On failure nothing of the launch is left
// running, and the error carries the tail of the browser's log.
func Launch(ctx context.Context, o Options) (Launched, error) {
	o = o.withDefaults()
	if l, ok := Running(o); ok {
		l.Reused = true
		d, err := waitAnswer(ctx, o, l, nil)
		if err != nil {
			return Launched{}, fmt.Errorf("the browser agent-vm launched (pid %d) runs, but %w (hint: `agent-vm browser --stop`, then launch it again)", l.Pid, err)
		}
		l.DevTools = d
		return l, nil
	}
	bin := o.Binary
	if bin == "" {
		var err error
		if bin, err = Find(o.Run); err != nil {
			return Launched{}, err
		}
	}
	if err := portFree(ctx, o.Port); err != nil {
		return Launched{}, err
	}
	profile := o.Dir.Sub(profileDir, 0o700)
	if err := profile.Make(); err != nil {
		return Launched{}, err
	}
	// A file left by an earlier run would name its port and target.
	if err := os.Remove(filepath.Join(profile.Path, activePortFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Launched{}, err
	}
	if err := denyHost(profile.Path); err != nil {
		return Launched{}, err
	}
	root := os.Geteuid() == 0
	l := Launched{Port: o.Port, Profile: profile.Path, Log: o.logPath(), Headless: Headless(o.Getenv)}
	if root {
		l.Warnings = append(l.Warnings, NoSandboxWarning)
	}
	p, err := o.Run.Start(execx.Detached{Path: bin, Args: Args(profile.Path, o.Port, l.Headless, root), StdoutPath: l.Log})
	if err != nil {
		return Launched{}, fmt.Errorf("starting %s: %w", bin, err)
	}
	l.Pid = p.Pid()
	if err := atomicfile.Write(o.pidPath(), []byte(strconv.Itoa(l.Pid)+"\n"), 0o600); err != nil {
		proc.Kill(l.Pid, isLaunched(profile.Path))
		return Launched{}, err
	}
	d, err := waitAnswer(ctx, o, l, p)
	if err != nil {
		proc.Kill(l.Pid, isLaunched(profile.Path))
		_ = os.Remove(o.pidPath())
		return Launched{}, fmt.Errorf("launching %s: %w\n%s:\n%s", bin, err, l.Log, logTail(l.Log, 15))
	}
	l.DevTools = d
	return l, nil
}

func (o Options) withDefaults() Options {
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Wait == 0 {
		o.Wait = DefaultWait
	}
	return o
}

// portFree says why the browser cannot have 127.0.0.1:port: Chromium
// would only log that it could not listen, and another browser answering
// there would be taken for it.
func portFree(ctx context.Context, port int) error {
	if ports.Listenable(port) {
		return nil
	}
	addr := bridge.DevToolsAddr(port)
	if d, err := bridge.ProbeDevTools(ctx, addr); err == nil {
		return fmt.Errorf("%s is the DevTools endpoint of a browser agent-vm did not launch (%s): use it (agent-vm browser BRANCH, without --launch), or launch on another port", addr, d.Browser)
	}
	return fmt.Errorf("%s is taken by another program: launch the browser on another port", addr)
}

// waitAnswer waits until l's endpoint answers as l's own (with the target
// it said it listens with), up to o.Wait. p, when set, is the
// process just started: its exit ends the wait.
func waitAnswer(ctx context.Context, o Options, l Launched, p execx.Process) (bridge.DevTools, error) {
	var exited <-chan struct{}
	if p != nil {
		exited = p.Exited()
	}
	addr := bridge.DevToolsAddr(l.Port)
	deadline := time.Now().Add(o.Wait)
	lastErr := errors.New("it has not said it listens yet")
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if target, ok := listeningTarget(l); ok {
			d, err := bridge.ProbeDevTools(ctx, addr)
			switch {
			case err != nil:
				lastErr = err
			case !strings.HasSuffix(d.WebSocketURL, target):
				return bridge.DevTools{}, fmt.Errorf("another browser answers on %s (%s)", addr, d.Browser)
			default:
				return d, nil
			}
		}
		if time.Now().After(deadline) {
			return bridge.DevTools{}, fmt.Errorf("its DevTools endpoint on %s does not answer after %s: %w", addr, o.Wait, lastErr)
		}
		select {
		case <-ctx.Done():
			return bridge.DevTools{}, ctx.Err()
		case <-exited:
			return bridge.DevTools{}, fmt.Errorf("it exited (code %d) before its DevTools endpoint answered", p.ExitCode())
		case <-time.After(wait):
		}
	}
}

// listeningTarget reads the browser target's path from what the browser
// said when its endpoint began to listen on port: Chromium prints
// "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID" to its
// stderr (the log, truncated at each launch), headless or not, and, with a
// window, also writes the port and the path to DevToolsActivePort in its
// profile.
func listeningTarget(l Launched) (string, bool) {
	prefix := "ws://" + bridge.DevToolsAddr(l.Port)
	var target string
	for _, line := range strings.Split(logTail(l.Log, 200), "\n") {
		if _, url, ok := strings.Cut(line, "DevTools listening on "); ok {
			if path, ok := strings.CutPrefix(strings.TrimSpace(url), prefix); ok && strings.HasPrefix(path, "/devtools/browser/") {
				target = path
			}
		}
	}
	if target != "" {
		return target, true
	}
	b, err := os.ReadFile(filepath.Join(l.Profile, activePortFile))
	if err != nil {
		return "", false
	}
	first, path, ok := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if !ok || strings.TrimSpace(first) != strconv.Itoa(l.Port) || !strings.HasPrefix(path, "/devtools/browser/") {
		return "", false
	}
	return strings.TrimSpace(path), true
}

// Stop ends the browser agent-vm launched with o's profile (SIGTERM, then
// SIGKILL after 10 s), and then its helpers: renderers, the zygote, the
// GPU and network processes, which end with it but may still write to the
// profile for a moment. A helper is a member of the browser's session
// (the launch started it in a session of its own) or has its profile on
// its command line, and is waited for, then killed, only while its
// command line is the one it had. Those are looked for before the browser
// is asked to end and again once it has: a browser that is ending may
// start another helper (seen in a test, writing to the profile after
// Stop had returned). Stop removes the pid file and reports whether a
// browser ran.
func Stop(ctx context.Context, o Options) (bool, error) {
	l, ok := Running(o)
	leader := 0
	if ok {
		leader = l.Pid
	}
	helpers := profileProcs(o, leader)
	if ok {
		match := isLaunched(l.Profile)
		proc.Signal(l.Pid, match, syscall.SIGTERM)
		if !proc.WaitGoneCtx(ctx, l.Pid, match, 10*time.Second) {
			proc.Kill(l.Pid, match)
		}
		if proc.Verified(l.Pid, match) {
			return true, fmt.Errorf("the browser agent-vm launched (pid %d) does not end", l.Pid)
		}
	}
	for round := 0; ; round++ {
		for pid, args := range helpers {
			same := func(a []string) bool { return slices.Equal(a, args) }
			if !proc.WaitGoneCtx(ctx, pid, same, 3*time.Second) {
				proc.Kill(pid, same)
			}
		}
		if round == 2 {
			break
		}
		helpers = profileProcs(o, leader)
	}
	if err := os.Remove(o.pidPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return ok, err
	}
	return ok, nil
}

// profileProcs are the processes, but leader itself, that have o's
// profile on their command line or are members of leader's session (0:
// none), with their command lines.
func profileProcs(o Options, leader int) map[int][]string {
	uses := usesProfile(o.profile())
	out := map[int][]string{}
	for _, pid := range proc.FindAll(func([]string) bool { return true }) {
		if pid == leader {
			continue
		}
		if args := proc.Args(pid); uses(args) || leader > 0 && proc.Session(pid) == leader {
			out[pid] = args
		}
	}
	return out
}

// logTail is the last n lines of the log at path (what there is of it).
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	const most = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > most {
		_, _ = f.Seek(-most, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return execx.TailLines(string(b), n)
}

// hostDenied are the profile's settings that keep the launched browser
// off the host's files whoever drives it, the DevTools relay aside: no
// file: URL opens (the URLBlocklist policy's setting, which a profile may
// hold) and no download is saved (DownloadRestrictions' "block all").
var hostDenied = map[string]any{
	"download_restrictions": 3,
	"policy":                map[string]any{"url_blocklist": []any{"file://*"}},
}

// denyHost writes hostDenied into the profile's preferences before each
// launch (the browser keeps the rest of the file as it left it).
func denyHost(profile string) error {
	p := filepath.Join(profile, "Default", "Preferences")
	prefs := map[string]any{}
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, &prefs); err != nil {
			return fmt.Errorf("the launched browser's preferences %s are not JSON: %w (hint: `agent-vm browser --stop`, then remove the file)", p, err)
		}
	}
	for k, v := range hostDenied {
		if m, ok := v.(map[string]any); ok {
			sub, _ := prefs[k].(map[string]any)
			if sub == nil {
				sub = map[string]any{}
			}
			for sk, sv := range m {
				sub[sk] = sv
			}
			v = sub
		}
		prefs[k] = v
	}
	out, err := json.Marshal(prefs)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(p, out, 0o600)
}
