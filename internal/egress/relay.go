package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Socket names in a VM's socket directory.
const (
	ProxySocket = "egress.sock"
	DoorSocket  = "door.sock"
)

// Relay carries one guest connection, which QEMU hands to the relay
// process as its stdin and stdout (guestfwd's cmd: a socket pair), to the
// proxy's unix socket sock. door > 0 makes it a door connection to that
// host port (the preamble the door socket expects).
//
// QEMU also connects the relay's stderr to the guest's connection, so the
// relay never writes to it: failures are only its exit status.
func Relay(ctx context.Context, sock string, door int, in io.Reader, out io.Writer) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return fmt.Errorf("reaching the VM's egress proxy: %w", err)
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if door > 0 {
		if _, err := io.WriteString(uc, strconv.Itoa(door)+"\n"); err != nil {
			return err
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(uc, in)
		_ = uc.CloseWrite()
	}()
	_, err = io.Copy(out, uc)
	if f, ok := out.(*os.File); ok {
		_ = f.Close()
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Run serves the proxy and the doors on their unix sockets (created 0600,
// replacing stale ones) until ctx ends.
func (p *Proxy) Run(ctx context.Context, proxySock, doorSock string) error {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, s := range []string{proxySock, doorSock} {
		_ = os.Remove(s)
		l, err := net.Listen("unix", s)
		if err != nil {
			return err
		}
		if err := os.Chmod(s, 0o600); err != nil {
			l.Close()
			return err
		}
		ls = append(ls, l)
	}
	errc := make(chan error, 2)
	go func() { errc <- p.ServeProxy(ls[0]) }()
	go func() { errc <- p.ServeDoors(ls[1]) }()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// Orphaned returns a context that ends with ctx or once the process whose
// pid file is pidFile has been seen and is gone (the VM's QEMU crashed or
// was killed: its proxy must not outlive it), or when no pid appears
// within grace (QEMU never started).
func Orphaned(ctx context.Context, pidFile string, grace time.Duration) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		seen := 0
		deadline := time.Now().Add(grace)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			b, err := os.ReadFile(pidFile)
			pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
			switch {
			case err == nil && perr == nil && pid > 0:
				if syscall.Kill(pid, 0) == syscall.ESRCH {
					return
				}
				seen = pid
			case seen != 0 || time.Now().After(deadline):
				return // the pid file went away (a stop), or never came
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return ctx
}
