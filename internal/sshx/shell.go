package sshx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/crypto/ssh"
	"golang.org/x/term"
)

// Shell runs an interactive login shell (or cmd, when not empty) on a PTY
// sized like the local terminal, with the local terminal in raw mode and
// window resizes passed on. The terminal is restored however the shell ends.
// When in is not a terminal, the shell runs without a PTY.
func Shell(ctx context.Context, c *ssh.Client, cmd string, in *os.File, out, errOut io.Writer) (int, error) {
	return interactive(ctx, c, cmd, in, out, errOut, false)
}

// Attach runs cmd on a PTY always, like Shell on a terminal: programs that
// need a terminal (a tmux client) get one even when in is a pipe, sized
// 80x24 then.
func Attach(ctx context.Context, c *ssh.Client, cmd string, in *os.File, out, errOut io.Writer) (int, error) {
	return interactive(ctx, c, cmd, in, out, errOut, true)
}

// TermSize is the size of the terminal f, or 80x24 when f is not one.
func TermSize(f *os.File) (width, height int) {
	if f != nil && term.IsTerminal(int(f.Fd())) {
		if w, h, err := term.GetSize(int(f.Fd())); err == nil && w > 0 && h > 0 {
			return w, h
		}
	}
	return 80, 24
}

func interactive(ctx context.Context, c *ssh.Client, cmd string, in *os.File, out, errOut io.Writer, alwaysPTY bool) (int, error) {
	s, err := c.NewSession()
	if err != nil {
		return -1, fmt.Errorf("opening an SSH session: %w", err)
	}
	defer s.Close()
	s.Stdin, s.Stdout, s.Stderr = in, out, errOut

	fd := int(in.Fd())
	isTerm := term.IsTerminal(fd)
	if isTerm || alwaysPTY {
		w, h := TermSize(in)
		termName := os.Getenv("TERM")
		if termName == "" || termName == "dumb" {
			termName = "xterm-256color"
		}
		modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
		if err := s.RequestPty(termName, h, w, modes); err != nil {
			return -1, fmt.Errorf("requesting a terminal: %w", err)
		}
	}
	if isTerm {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return -1, fmt.Errorf("putting the terminal in raw mode: %w", err)
		}
		defer term.Restore(fd, old)
		stopResize := forwardResizes(fd, s)
		defer stopResize()
	}
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	if cmd == "" {
		err = s.Shell()
		if err == nil {
			err = s.Wait()
		}
	} else {
		err = s.Run(cmd)
	}
	code, err := exitStatus(ctx, err)
	var missing *ssh.ExitMissingError
	if errors.As(err, &missing) {
		return 0, nil // the connection closed after the shell ended
	}
	return code, err
}

// forwardResizes passes SIGWINCH on as window-change requests.
func forwardResizes(fd int, s *ssh.Session) func() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				if w, h, err := term.GetSize(fd); err == nil {
					_ = s.WindowChange(h, w)
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
