package mcpproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Runs stdio servers with os/exec directly rather than through execx: a
// server is a long-lived peer spoken to over pipes, which execx.Runner (run to
// completion, or detach with output to files) does not model. Everything here
// is exercised against real processes in the tests.

// drainTimeout is how long the proxy keeps reading a server's output after
// the process exited (its last responses may still sit in the pipe), and how
// long it waits for its pipe readers after killing it before closing the
// pipes itself (an escaped grandchild may hold them open).
const drainTimeout = time.Second

// stderrLineMax bounds one logged line of a server's stderr.
const stderrLineMax = 8 << 10

var errMessageTooLarge = errors.New("message too large")

// child is one running stdio MCP server process.
type child struct {
	log     hclog.Logger
	cmd     *exec.Cmd
	pid     int
	stdinW  *os.File
	stdoutR *os.File
	stderrR *os.File
	in      *mailbox // lines for the server's stdin

	exited  chan struct{} // closed once the process is reaped
	outDone chan struct{} // closed once stdout reached EOF or failed
	readErr error         // why stdout reading stopped (nil at EOF); valid after outDone
	io      sync.WaitGroup
}

type childSpec struct {
	server     Server
	path       string // resolved program
	maxMessage int    // largest line accepted from the server
	inLimit    int    // bytes queued for stdin before senders are refused
	onMessage  func([]byte)
	log        hclog.Logger
}

func startChild(spec childSpec) (*child, error) {
	p, err := newPipes()
	if err != nil {
		return nil, err
	}
	srv := spec.server
	cmd := &exec.Cmd{
		Path:   spec.path,
		Args:   append([]string{srv.Command}, srv.Args...),
		Env:    childEnv(srv.Env),
		Dir:    srv.Dir,
		Stdin:  p.stdinR,
		Stdout: p.stdoutW,
		Stderr: p.stderrW,
		// Its own process group, so stopping it reaches whatever it spawned
		// (npx -> node, uvx -> python).
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	err = cmd.Start()
	p.closeChildEnds() // the child holds its own copies now (or never will)
	if err != nil {
		p.closeOurEnds()
		return nil, err
	}
	c := &child{
		log:     spec.log.With("pid", cmd.Process.Pid),
		cmd:     cmd,
		pid:     cmd.Process.Pid,
		stdinW:  p.stdinW,
		stdoutR: p.stdoutR,
		stderrR: p.stderrR,
		in:      newMailbox(spec.inLimit),
		exited:  make(chan struct{}),
		outDone: make(chan struct{}),
	}
	go func() {
		_ = cmd.Wait() // the exit status is read from cmd.ProcessState
		close(c.exited)
	}()
	c.io.Add(3)
	go c.readStdout(spec.maxMessage, spec.onMessage)
	go c.readStderr()
	go c.writeStdin()
	return c, nil
}

// pipes are a server's stdin, stdout and stderr: the child's ends and ours.
type pipes struct {
	stdinR, stdinW, stdoutR, stdoutW, stderrR, stderrW *os.File
}

func newPipes() (*pipes, error) {
	var p pipes
	var err error
	if p.stdinR, p.stdinW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if p.stdoutR, p.stdoutW, err = os.Pipe(); err != nil {
		p.closeChildEnds()
		p.closeOurEnds()
		return nil, err
	}
	if p.stderrR, p.stderrW, err = os.Pipe(); err != nil {
		p.closeChildEnds()
		p.closeOurEnds()
		return nil, err
	}
	return &p, nil
}

func (p *pipes) closeChildEnds() { closeFiles(p.stdinR, p.stdoutW, p.stderrW) }
func (p *pipes) closeOurEnds()   { closeFiles(p.stdinW, p.stdoutR, p.stderrR) }

func closeFiles(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

func childEnv(extra map[string]string) []string {
	env := os.Environ()
	for k, v := range extra {
		env = append(env, k+"="+v) // exec keeps the last of duplicate keys
	}
	return env
}

// send queues one message for the server's stdin.
func (c *child) send(raw []byte) error { return c.in.put(item{raw: raw}) }

func (c *child) writeStdin() {
	defer c.io.Done()
	defer c.stdinW.Close()
	var buf []byte
	for {
		items, closed := c.in.take()
		for _, it := range items {
			buf = append(append(buf[:0], it.raw...), '\n')
			if _, err := c.stdinW.Write(buf); err != nil {
				if !errors.Is(err, os.ErrClosed) && !errors.Is(err, syscall.EPIPE) {
					c.log.Warn("writing to the server's stdin failed", "error", err)
				}
				c.in.close()
				return
			}
		}
		if closed {
			// Nothing comes after a close, and its wake-up may already have
			// been spent on the lines just written: waiting would hang.
			return
		}
		<-c.in.ready
	}
}

func (c *child) readStdout(maxMessage int, onMessage func([]byte)) {
	defer c.io.Done()
	defer close(c.outDone)
	r := bufio.NewReaderSize(c.stdoutR, 64<<10)
	for {
		line, err := readLine(r, maxMessage)
		if len(line) > 0 {
			onMessage(line)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
				c.readErr = err
			}
			return
		}
	}
}

// readLine returns the next non-empty line without its line ending, at most
// max bytes long; a longer line is an error.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > max+2 { // +2 for "\r\n"
			return nil, fmt.Errorf("%w: the server wrote a line longer than %d bytes", errMessageTooLarge, max)
		}
		line = append(line, frag...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		line = bytes.TrimRight(line, "\r\n")
		if err != nil || len(line) > 0 {
			return line, err
		}
	}
}

func (c *child) readStderr() {
	defer c.io.Done()
	r := bufio.NewReaderSize(c.stderrR, 4096)
	for {
		line, err := r.ReadSlice('\n')
		if len(line) > stderrLineMax {
			line = line[:stderrLineMax]
		}
		if s := strings.TrimRight(string(line), "\r\n"); strings.TrimSpace(s) != "" {
			c.log.Info("stderr: " + s)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// stdoutErr is why reading stdout stopped, once it has (nil at EOF or while
// still reading).
func (c *child) stdoutErr() error {
	select {
	case <-c.outDone:
		return c.readErr
	default:
		return nil
	}
}

// exitStatus describes how the process ended, for logs and client errors.
func (c *child) exitStatus() string {
	select {
	case <-c.exited:
		if st := c.cmd.ProcessState; st != nil {
			return "exited (" + st.String() + ")"
		}
		return "exited"
	default:
		return "closed its standard output"
	}
}

// stop ends the server the way the stdio transport asks: close its stdin,
// then SIGTERM, then SIGKILL, each after half of grace, always to the whole
// process group. It returns once the process is reaped and the pipe
// goroutines are done.
func (c *child) stop(grace time.Duration) {
	c.in.close() // the writer drains what is queued, then closes stdin
	t := time.NewTimer(grace / 2)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
		c.signalGroup(syscall.SIGTERM)
		t.Reset(grace / 2)
		select {
		case <-c.exited:
		case <-t.C:
			c.log.Warn("server did not exit after SIGTERM; killing it")
			c.signalGroup(syscall.SIGKILL)
			<-c.exited
		}
	}
	c.signalGroup(syscall.SIGKILL) // whatever it left behind in its group
	done := make(chan struct{})
	go func() { c.io.Wait(); close(done) }()
	t.Reset(drainTimeout)
	select {
	case <-done:
	case <-t.C:
		// Something outside the group holds the pipes: stop reading them.
		c.stdinW.Close()
		c.stdoutR.Close()
		c.stderrR.Close()
		<-done
	}
	c.stdoutR.Close()
	c.stderrR.Close()
}

func (c *child) signalGroup(sig syscall.Signal) {
	if err := syscall.Kill(-c.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		c.log.Warn("signalling the server's process group failed", "signal", sig, "error", err)
	}
}
