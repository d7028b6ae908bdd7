// Package execxtest holds a FAKE execx.Runner for tests.
//
// It stands only at the exec boundary: it records every program the code under
// test asked to run, answers from the handlers the test registered, and fails
// the test on any call it was not told to expect (packer's DriverMock idea).
// Tests that use it say so in their names or comments; everything above the
// exec boundary stays real.
package execxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// Call is one recorded invocation.
type Call struct {
	Detached bool     // started with Start rather than Run
	Path     string   // as asked (not resolved)
	Args     []string //
	Dir      string   //
	Env      []string // only the extra entries the caller set (all of them when ExactEnv)
	ExactEnv bool     // Detached: Env is the whole environment
	Stdin    []byte   // what Run or Start was given on stdin, if anything
	Stdout   string   // Detached: the stdout file
	Stderr   string   // Detached: the stderr file
}

// Reply is what a handler answers for a call.
type Reply struct {
	Stdout   string
	Stderr   string
	ExitCode int   // non-zero makes Run return an *execx.Error
	Err      error // returned as is (e.g. to simulate a missing program)
}

// Handler answers one call.
type Handler func(c Call) Reply

// Fake is a recording, strict execx.Runner.
type Fake struct {
	t        testing.TB
	mu       sync.Mutex
	handlers map[string]Handler // by program base name
	paths    map[string]string  // LookPath answers
	calls    []Call
	nextPid  int
}

var _ execx.Runner = (*Fake)(nil)

// New returns a Fake that fails t on unexpected calls.
func New(t testing.TB) *Fake {
	return &Fake{t: t, handlers: map[string]Handler{}, paths: map[string]string{}, nextPid: 100000}
}

// On registers the handler for a program, matched by base name.
func (f *Fake) On(program string, h Handler) *Fake {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handlers[filepath.Base(program)] = h
	return f
}

// Installed makes LookPath(name) answer path.
func (f *Fake) Installed(name, path string) *Fake {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paths[name] = path
	return f
}

// Calls returns a copy of the recorded calls, in order.
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Call(nil), f.calls...)
}

// Run implements execx.Runner.
func (f *Fake) Run(ctx context.Context, c execx.Cmd) (execx.Result, error) {
	call := Call{Path: c.Path, Args: append([]string(nil), c.Args...), Dir: c.Dir, Env: append([]string(nil), c.Env...)}
	if c.Stdin != nil {
		call.Stdin, _ = io.ReadAll(c.Stdin)
	}
	r, err := f.answer(call)
	if err != nil {
		return execx.Result{ExitCode: -1}, &execx.Error{Cmd: c.String(), ExitCode: -1, Err: err}
	}
	if c.Stdout != nil {
		_, _ = io.WriteString(c.Stdout, r.Stdout)
	}
	if c.Stderr != nil {
		_, _ = io.WriteString(c.Stderr, r.Stderr)
	}
	res := execx.Result{Stdout: []byte(r.Stdout), Stderr: []byte(r.Stderr), ExitCode: r.ExitCode}
	if r.Err != nil {
		return res, &execx.Error{Cmd: c.String(), ExitCode: -1, Err: r.Err}
	}
	if ctx.Err() != nil {
		return res, &execx.Error{Cmd: c.String(), ExitCode: -1, Err: ctx.Err()}
	}
	if r.ExitCode != 0 {
		return res, &execx.Error{Cmd: c.String(), ExitCode: r.ExitCode, Stderr: execx.Tail(res.Stderr, 4096),
			Err: fmt.Errorf("exit status %d", r.ExitCode)}
	}
	return res, nil
}

// Start implements execx.Runner. The fake process "exits" at once with the
// handler's exit code.
func (f *Fake) Start(d execx.Detached) (execx.Process, error) {
	call := Call{Detached: true, Path: d.Path, Args: append([]string(nil), d.Args...), Dir: d.Dir,
		Env: append([]string(nil), d.Env...), ExactEnv: d.ExactEnv, Stdout: d.StdoutPath, Stderr: d.StderrPath,
		Stdin: bytes.Clone(d.Stdin)}
	r, err := f.answer(call)
	if err != nil {
		return nil, err
	}
	if r.Err != nil {
		return nil, r.Err
	}
	f.mu.Lock()
	f.nextPid++
	p := &fakeProcess{pid: f.nextPid, code: r.ExitCode, exited: make(chan struct{})}
	f.mu.Unlock()
	close(p.exited)
	return p, nil
}

// LookPath implements execx.Runner: registered answers first, then any
// program that has a handler is "installed" under /fake/bin.
func (f *Fake) LookPath(name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.paths[name]; ok {
		if p == "" {
			return "", fmt.Errorf("exec: %q: executable file not found in $PATH", name)
		}
		return p, nil
	}
	if _, ok := f.handlers[filepath.Base(name)]; ok {
		return "/fake/bin/" + filepath.Base(name), nil
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", name)
}

func (f *Fake) answer(call Call) (Reply, error) {
	f.mu.Lock()
	f.calls = append(f.calls, call)
	h, ok := f.handlers[filepath.Base(call.Path)]
	f.mu.Unlock()
	if !ok {
		f.t.Errorf("execxtest: unexpected call: %s %q", call.Path, call.Args)
		return Reply{}, errors.New("execxtest: unexpected call")
	}
	return h(call), nil
}

type fakeProcess struct {
	pid    int
	code   int
	exited chan struct{}
}

func (p *fakeProcess) Pid() int                { return p.pid }
func (p *fakeProcess) Exited() <-chan struct{} { return p.exited }
func (p *fakeProcess) ExitCode() int           { return p.code }
