// Package execx is the one place where agent-vm runs external programs.
//
// Everything that execs (git, qemu-img, nix, mmdebstrap, virtiofsd, qemu) goes
// through a Runner, so tests can put a recording fake (package execxtest) at
// exactly this boundary and nowhere else. Errors keep the program's stderr, so
// a failure can be shown to the user with the tool's own words (gh's CmdError).
package execx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Cmd describes one program invocation.
type Cmd struct {
	Path string   // program name (looked up in PATH) or absolute path
	Args []string // arguments, without the program itself
	Dir  string   // working directory; empty means the current one
	// Env is appended to the current environment (later entries win).
	Env []string
	// Stdin, when set, is the program's standard input.
	Stdin io.Reader
	// Stdout and Stderr, when set, receive the output as it is produced, in
	// addition to the copies kept in Result (stderr keeps only its tail).
	Stdout io.Writer
	Stderr io.Writer
}

// String renders the command the way a user would type it, for errors and
// "to reproduce, run:" hints. Arguments are shell-quoted.
func (c Cmd) String() string {
	parts := make([]string, 0, len(c.Args)+1)
	parts = append(parts, ShellQuote(c.Path))
	for _, a := range c.Args {
		parts = append(parts, ShellQuote(a))
	}
	return strings.Join(parts, " ")
}

// Result is what a finished program left behind.
type Result struct {
	Stdout   []byte
	Stderr   []byte
	ExitCode int
}

// Detached describes a program started to outlive the caller: it runs in its
// own session (so Ctrl-C in the terminal does not reach it), with stdin from
// /dev/null and stdout/stderr appended to the named files.
type Detached struct {
	Path string
	Args []string
	Dir  string
	Env  []string // appended to the current environment, unless ExactEnv
	// ExactEnv: Env is the program's whole environment; nothing of ours is
	// inherited.
	ExactEnv   bool
	StdoutPath string // file that receives stdout (created 0600, truncated)
	StderrPath string // file that receives stderr; empty means StdoutPath
	// Stdin, when set, is written to the program's standard input through
	// a pipe, which is then closed (otherwise stdin is /dev/null). It may
	// hold secrets (the egress proxy's): it is never logged or kept.
	Stdin []byte
}

// Process is a started detached program.
type Process interface {
	Pid() int
	// Exited is closed when the program has exited, if the starter is still
	// alive to see it.
	Exited() <-chan struct{}
	// ExitCode is valid once Exited is closed; -1 when killed by a signal.
	ExitCode() int
}

// Runner runs external programs. Implementations: OS (the real one) and
// execxtest.Fake (a recording fake for tests).
type Runner interface {
	// Run runs the program to completion. A non-zero exit is an *Error.
	Run(ctx context.Context, c Cmd) (Result, error)
	// Start starts a detached program and returns at once.
	Start(d Detached) (Process, error)
	// LookPath finds a program the way exec.LookPath does.
	LookPath(name string) (string, error)
}

// Error is a program that ran and failed, or could not be started.
type Error struct {
	Cmd      string // the command line, shell-quoted
	ExitCode int    // -1 when it did not start or was killed by a signal
	Stderr   string // the tail of its stderr, trimmed
	Err      error  // the underlying error
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %v", e.Cmd, e.Err)
	if e.Stderr != "" {
		b.WriteString(": ")
		b.WriteString(e.Stderr)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// stderrTailBytes bounds how much of a program's stderr an Error carries.
const stderrTailBytes = 4096

// OS is the Runner that really executes programs.
type OS struct{}

var _ Runner = OS{}

// Run implements Runner.
func (OS) Run(ctx context.Context, c Cmd) (Result, error) {
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Dir = c.Dir
	if len(c.Env) > 0 {
		cmd.Env = append(os.Environ(), c.Env...)
	}
	cmd.Stdin = c.Stdin
	var stdout bytes.Buffer
	stderr := &tailBuffer{max: 64 << 10}
	cmd.Stdout = teeTo(&stdout, c.Stdout)
	cmd.Stderr = teeTo(stderr, c.Stderr)
	// Put the child in its own process group and kill the whole group on
	// cancellation, so helpers it spawned do not outlive us. Pdeathsig covers
	// the case cancellation cannot: we are SIGKILLed, and a git clone left
	// behind would go on writing into a staging directory nobody owns. (It
	// fires when the forking OS thread ends; Go ends threads only for
	// goroutines that exit locked to one, which this program never does.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	err := cmd.Run()
	res := Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: cmd.ProcessState.ExitCode()}
	if err == nil {
		return res, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		err = ctxErr
	}
	return res, &Error{Cmd: c.String(), ExitCode: res.ExitCode, Stderr: Tail(res.Stderr, stderrTailBytes), Err: err}
}

// Start implements Runner.
// stdinTimeout bounds the write of a detached program's standard input.
const stdinTimeout = 30 * time.Second

func (OS) Start(d Detached) (Process, error) {
	cmd := exec.Command(d.Path, d.Args...)
	cmd.Dir = d.Dir
	switch {
	case d.ExactEnv:
		cmd.Env = append([]string{}, d.Env...) // non-nil: an empty Env is an empty environment
	case len(d.Env) > 0:
		cmd.Env = append(os.Environ(), d.Env...)
	}
	errf := func(err error) error {
		return &Error{Cmd: Cmd{Path: d.Path, Args: d.Args}.String(), ExitCode: -1, Err: err}
	}
	out, err := os.OpenFile(d.StdoutPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, errf(err)
	}
	defer out.Close()
	cmd.Stdout = out
	cmd.Stderr = out
	if d.StderrPath != "" && d.StderrPath != d.StdoutPath {
		errOut, err := os.OpenFile(d.StderrPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return nil, errf(err)
		}
		defer errOut.Close()
		cmd.Stderr = errOut
	}
	// Stdin goes through a pipe written before Start returns, not by
	// exec's copying goroutine: a starter that exits at once (agent-vm's
	// __detach on a libvirt host) would otherwise end before the copy.
	var stdin *os.File
	if d.Stdin != nil {
		pr, pw, err := os.Pipe()
		if err != nil {
			return nil, errf(err)
		}
		defer pr.Close()
		defer pw.Close()
		cmd.Stdin, stdin = pr, pw
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, errf(err)
	}
	if stdin != nil {
		// A pipe holds 64 KiB: a program that reads nothing fails the
		// write of more only after the deadline.
		_ = stdin.SetWriteDeadline(time.Now().Add(stdinTimeout))
		_, werr := stdin.Write(d.Stdin)
		if err := errors.Join(werr, stdin.Close()); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, errf(fmt.Errorf("writing its standard input: %w", err))
		}
	}
	p := &osProcess{pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		// Reap the child while we live; once we exit, init adopts it.
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	return p, nil
}

// LookPath implements Runner.
func (OS) LookPath(name string) (string, error) { return exec.LookPath(name) }

type osProcess struct {
	pid    int
	code   int
	exited chan struct{}
}

func (p *osProcess) Pid() int                { return p.pid }
func (p *osProcess) Exited() <-chan struct{} { return p.exited }
func (p *osProcess) ExitCode() int           { return p.code }

// ExitCode returns the exit code carried by err, or -1 when err is not a
// program failure.
func ExitCode(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.ExitCode
	}
	return -1
}

// Tail returns the last max bytes of b as trimmed text, starting at a line
// boundary when one is near.
func Tail(b []byte, max int) string {
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i < 200 {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(b))
}

// TailLines returns the last n lines of s.
func TailLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ShellQuote quotes s for a POSIX shell when it needs quoting.
func ShellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./-_", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func teeTo(keep io.Writer, extra io.Writer) io.Writer {
	if extra == nil {
		return keep
	}
	return io.MultiWriter(keep, extra)
}

// tailBuffer keeps only the last max bytes written to it.
type tailBuffer struct {
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) Bytes() []byte { return t.buf }
