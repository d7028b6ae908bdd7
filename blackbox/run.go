package blackbox

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Cmd is a program to run, and how.
type Cmd struct {
	Path  string
	Args  []string
	Dir   string
	Env   []string // nil: this process's environment
	Stdin io.Reader
	// Grace is how long the program has to exit after SIGINT before it is
	// killed.
	Grace time.Duration
	// OnLine receives each line the program writes to stderr, as it comes.
	OnLine func(string)
	// Watch, when set, sees every line the program writes and counts the
	// CPU time of its process group while it runs.
	Watch *Watch
}

// Exit is how a program that Run ran ended.
type Exit struct {
	Stdout, Stderr string
	Code           int // the exit status; -1 when it did not exit by itself
	Start, End     time.Time
	// Err is what running it returned: nil for exit status 0, an
	// *exec.ExitError for another status or a signal, or why it could not
	// run.
	Err error
}

// Run runs c to its end, in its own process group, so that a Ctrl-C on the
// terminal reaches it only through us, once. When ctx ends, the program
// gets SIGINT, as from Ctrl-C, so that its own interrupt handling runs
// (agent-vm stops a VM it was booting); if it has not exited c.Grace later,
// it is killed.
func Run(ctx context.Context, c Cmd) Exit {
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Dir, cmd.Env, cmd.Stdin = c.Dir, c.Env, c.Stdin
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = c.Grace
	onLine, watchLine := c.OnLine, func(string) {}
	if c.Watch != nil {
		watchLine = c.Watch.Line
		onLine = func(l string) {
			c.Watch.Line(l)
			if c.OnLine != nil {
				c.OnLine(l)
			}
		}
	}
	stdout := &lineWriter{onLine: watchLine}
	stderr := &lineWriter{onLine: onLine}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	res := Exit{Code: -1, Start: time.Now()}
	res.Err = cmd.Start()
	if res.Err == nil {
		if c.Watch != nil {
			defer c.Watch.Track(cmd.Process.Pid)() // its own process group
		}
		res.Err = cmd.Wait()
	}
	res.End = time.Now()
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	if cmd.ProcessState != nil {
		res.Code = cmd.ProcessState.ExitCode()
	}
	return res
}

// lineWriter keeps everything written to it and hands each complete line
// to onLine as it arrives.
type lineWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte
	onLine  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.onLine == nil {
		return len(p), nil
	}
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.onLine(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
